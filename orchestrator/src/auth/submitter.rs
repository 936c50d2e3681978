//! Who submitted a job, and which of its tenant's jobs a caller sees and
//! cancels (docs/security.md, "Roles"; decision 0049).
//!
//! Each credential has a stable identity, its principal: `token:` and the
//! first 16 hex digits of the token's SHA-256, or `client:` and the client
//! certificate's name in the tokens file. A job records its submitter: the
//! person the credential names, when it names one, else the principal
//! ([`Caller::submitter`]); never anything the request says.
//! [`Caller::sight`] and [`Caller::access`] are the one rule of who sees
//! and cancels which job: pure, with a table test.

use tonic::Status;

use super::{Caller, Role, Rpc};

/// What a caller does to one job of its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobAction {
    /// `GetJob`, `WatchJob`, an entry of `ListJobs`, the job a repeated
    /// idempotency key names.
    Read,
    /// `CancelJob`.
    Cancel,
}

impl JobAction {
    fn rpc(self) -> Rpc {
        match self {
            Self::Read => Rpc::ReadJobs,
            Self::Cancel => Rpc::CancelJob,
        }
    }
}

/// What [`Caller::access`] says of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobAccess {
    /// Go ahead.
    Allowed,
    /// Answer as for a job that does not exist (`NOT_FOUND`, word for
    /// word): the caller may not learn that it exists.
    Hidden,
    /// The caller sees the job but may not do this to it:
    /// `PERMISSION_DENIED` ([`Caller::refusal`]).
    Refused,
}

/// Which of its tenant's jobs a caller sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sight {
    /// Every one: an operator or a reader (and so every credential of a
    /// tenant that gives no roles, and every caller without
    /// authentication).
    Every,
    /// Those whose recorded submitter is this one; none when it is `None`
    /// (a credential with no identity), and never a job that records no
    /// submitter (one stored before submitters were, decision 0049).
    Submitted(Option<String>),
}

impl Caller {
    /// Who this caller is as the submitter of a job: the person its
    /// credential names, else its principal; `None` without
    /// authentication.
    pub(crate) fn submitter(&self) -> Option<String> {
        self.person.clone().or_else(|| self.principal.clone())
    }

    /// Which of its tenant's jobs this caller sees: all of them with the
    /// role `operator` or `reader`, else those it submitted.
    pub(crate) fn sight(&self) -> Sight {
        if self.roles.any(&[Role::Operator, Role::Reader]) {
            Sight::Every
        } else {
            Sight::Submitted(self.submitter())
        }
    }

    /// Whether this caller may `action` a job of its own tenant that
    /// `submitter` submitted (`None`: the job records no submitter). A job
    /// it does not see is [`JobAccess::Hidden`]; one it sees but may not
    /// cancel (another's, without the role `operator`) is
    /// [`JobAccess::Refused`]. The tenant is checked before: another
    /// tenant's job is never this caller's.
    pub(crate) fn access(&self, action: JobAction, submitter: Option<&str>) -> JobAccess {
        let mine = self.submitter();
        let own = submitter.is_some() && submitter == mine.as_deref();
        if !own && self.sight() != Sight::Every {
            return JobAccess::Hidden;
        }
        if !self.roles.any(action.rpc().needs()) {
            return JobAccess::Refused;
        }
        match action {
            JobAction::Read => JobAccess::Allowed,
            JobAction::Cancel if own || self.roles.has(Role::Operator) => JobAccess::Allowed,
            JobAction::Cancel => JobAccess::Refused,
        }
    }

    /// The `PERMISSION_DENIED` of an `action` that [`access`](Self::access)
    /// refused, naming the role it needed and the caller's.
    pub(crate) fn refusal(&self, action: JobAction) -> Status {
        if let Err(refused) = self.check(action.rpc()) {
            return refused;
        }
        Status::permission_denied(format!(
            "CancelJob of a job another credential submitted needs the role operator; this \
             credential of tenant {:?} has {} (roles in the tokens file, docs/security.md)",
            self.tenant, self.roles
        ))
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
pub(crate) fn reads_as_principal(name: &str) -> bool {
    name.starts_with("token:") || name.starts_with("client:")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Roles;
    use JobAccess::{Allowed, Hidden, Refused};
    use JobAction::{Cancel, Read};
    use Role::{Agent, Approver, Operator, Reader};

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

    /// Who sees and cancels which job of its tenant: by its roles, and by
    /// whether it submitted the job (`own`), another did (`other`), or the
    /// job records no one (`legacy`, stored before submitters were).
    #[test]
    fn an_agent_sees_and_cancels_its_own_jobs_an_operator_or_reader_all() {
        let (me, other) = ("token:00000000000000aa", "token:00000000000000bb");
        let agent = caller(&[Agent], Some(me), None);
        let ana = caller(&[Agent], Some(me), Some("Ana"));
        let both = caller(&[Agent, Reader], Some(me), None);
        let operator = caller(&[Operator], Some(me), None);
        let reader = caller(&[Reader], Some(me), None);
        let approver = caller(&[Approver], Some(me), None);
        let everything = caller(&[Agent, Approver, Operator, Reader], Some(me), None);
        let nobody = caller(&[Agent], None, None);
        let (own, theirs, legacy) = (Some(me), Some(other), None);
        let rows = [
            // An agent alone: its own jobs only; another's and one that
            // records no submitter are as missing.
            (&agent, Read, own, Allowed),
            (&agent, Cancel, own, Allowed),
            (&agent, Read, theirs, Hidden),
            (&agent, Cancel, theirs, Hidden),
            (&agent, Read, legacy, Hidden),
            (&agent, Cancel, legacy, Hidden),
            // A person is the submitter, whichever credential she uses.
            (&ana, Read, Some("Ana"), Allowed),
            (&ana, Cancel, Some("Ana"), Allowed),
            (&ana, Read, own, Hidden),
            // Agent and reader (the approvers form's default): sees every
            // job, cancels only its own.
            (&both, Read, theirs, Allowed),
            (&both, Read, legacy, Allowed),
            (&both, Cancel, own, Allowed),
            (&both, Cancel, theirs, Refused),
            (&both, Cancel, legacy, Refused),
            // An operator sees and cancels every job.
            (&operator, Read, theirs, Allowed),
            (&operator, Cancel, theirs, Allowed),
            (&operator, Cancel, legacy, Allowed),
            // A reader sees every job and cancels none.
            (&reader, Read, theirs, Allowed),
            (&reader, Read, legacy, Allowed),
            (&reader, Cancel, own, Refused),
            (&reader, Cancel, theirs, Refused),
            // An approver alone reads no job (the RPC refused it before).
            (&approver, Read, own, Refused),
            (&approver, Read, theirs, Hidden),
            // Every role (no roles given, or no authentication): all.
            (&everything, Cancel, theirs, Allowed),
            (&everything, Read, legacy, Allowed),
            // No identity: nothing is its own, not even a job of no one.
            (&nobody, Read, legacy, Hidden),
            (&nobody, Read, theirs, Hidden),
        ];
        for (caller, action, submitter, expected) in rows {
            assert_eq!(
                caller.access(action, submitter),
                expected,
                "{} {action:?} of {submitter:?}",
                caller.roles
            );
        }
        assert_eq!(agent.sight(), Sight::Submitted(Some(me.to_owned())));
        assert_eq!(ana.sight(), Sight::Submitted(Some("Ana".to_owned())));
        assert_eq!(nobody.sight(), Sight::Submitted(None));
        for sees_all in [&both, &operator, &reader, &everything] {
            assert_eq!(sees_all.sight(), Sight::Every, "{}", sees_all.roles);
        }
        assert_eq!(Caller::anonymous().sight(), Sight::Every, "auth off");
    }

    #[test]
    fn a_refusal_names_the_role_it_needed() {
        let both = caller(&[Agent, Reader], Some("token:00000000000000aa"), None);
        let refused = both.refusal(Cancel);
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            refused.message(),
            "CancelJob of a job another credential submitted needs the role operator; this \
             credential of tenant \"default\" has agent, reader (roles in the tokens file, \
             docs/security.md)"
        );
        let reader = caller(&[Reader], None, None);
        assert!(
            reader
                .refusal(Cancel)
                .message()
                .starts_with("CancelJob needs the role agent or operator;"),
            "the RPC's own refusal"
        );
    }
}
