//! Who submitted a job (docs/security.md, "Roles").
//!
//! Each credential has a stable identity, its principal: `token:` and the
//! first 16 hex digits of the token's SHA-256, or `client:` and the client
//! certificate's name in the tokens file. A job records its submitter: the
//! person the credential names, when it names one, else the principal
//! ([`Caller::submitter`]); never anything the request says.

use super::Caller;

impl Caller {
    /// Who this caller is as the submitter of a job: the person its
    /// credential names, else its principal; `None` without
    /// authentication.
    pub(crate) fn submitter(&self) -> Option<String> {
        self.person.clone().or_else(|| self.principal.clone())
    }
}

/// The principal of the token whose SHA-256 is `hash`: `token:` and the
/// first 16 hex digits of the hash (64 bits: enough to tell a tenant's
/// tokens apart, and no more of the hash than that).
pub(super) fn token_principal(hash: &[u8; 32]) -> String {
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("token:{hex}")
}

/// The principal of a client certificate valid for `name`, a tenant's
/// `client_names` entry.
pub(super) fn client_principal(name: &str) -> String {
    format!("client:{name}")
}

/// Whether a person's name reads as a credential's principal (`token:…`,
/// `client:…`): such a name is refused, or its person would submit, see and
/// cancel as that credential.
pub(super) fn reads_as_principal(name: &str) -> bool {
    name.starts_with("token:") || name.starts_with("client:")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Role, Roles};
    use Role::Agent;

    fn caller(roles: &[Role], principal: Option<&str>, person: Option<&str>) -> Caller {
        Caller {
            roles: Roles::of(roles),
            principal: principal.map(str::to_owned),
            person: person.map(str::to_owned),
            ..Caller::anonymous()
        }
    }

    #[test]
    fn a_credential_submits_as_its_person_else_as_itself() {
        assert_eq!(
            token_principal(&[0xab; 32]),
            "token:abababababababab",
            "16 hex digits"
        );
        assert_eq!(client_principal("a.example"), "client:a.example");
        let token = Some("token:0123456789abcdef");
        assert_eq!(caller(&[Agent], token, None).submitter().as_deref(), token);
        assert_eq!(
            caller(&[Agent], token, Some("Ana")).submitter().as_deref(),
            Some("Ana"),
            "the person, so that each of her credentials is her"
        );
        assert_eq!(Caller::anonymous().submitter(), None);
        for (name, refused) in [
            ("Ana Lima", false),
            ("tokens: Ana", false),
            ("token:0123456789abcdef", true),
            ("client:a.example", true),
        ] {
            assert_eq!(reads_as_principal(name), refused, "{name}");
        }
    }
}
