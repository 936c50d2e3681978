//! What a verified token's claims say: its tenant, its person and its
//! roles, as the issuer's mapping reads them. Pure, with table tests.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Refusal;
use super::options::IssuerOptions;
use crate::auth::submitter::reads_as_principal;
use crate::auth::{Role, Roles, is_valid_tenant};

/// Longest person a claim may name: it is recorded with decisions and jobs
/// and shown in events.
const MAX_PERSON_CHARS: usize = 128;

/// Who a verified token stands for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Identity {
    pub tenant: String,
    pub person: String,
    pub roles: Roles,
}

/// Where a token's tenant comes from.
#[derive(Debug)]
enum TenantFrom {
    /// Every token of the issuer is this tenant's.
    Fixed(String),
    /// The claim `name` names it, one of `allowed` (empty: any).
    Claim { name: String, allowed: Vec<String> },
}

/// How one issuer's claims map to an [`Identity`].
#[derive(Debug)]
pub(crate) struct Mapping {
    tenant: TenantFrom,
    person_claim: String,
    role_claims: Vec<String>,
    roles: BTreeMap<String, Vec<Role>>,
}

impl Mapping {
    /// The mapping `issuer` configures.
    ///
    /// # Errors
    ///
    /// What is wrong with it, naming the setting.
    pub(crate) fn of(issuer: &IssuerOptions) -> Result<Self, String> {
        let tenant = match (&issuer.tenant, &issuer.tenant_claim) {
            (Some(tenant), None) if is_valid_tenant(tenant) => TenantFrom::Fixed(tenant.clone()),
            (Some(tenant), None) => return Err(format!("tenant {tenant:?} is not a tenant name")),
            (None, Some(name)) if !name.is_empty() => TenantFrom::Claim {
                name: name.clone(),
                allowed: issuer.tenants.clone(),
            },
            _ => return Err("give exactly one of tenant_claim and tenant".to_owned()),
        };
        if let Some(tenant) = issuer.tenants.iter().find(|t| !is_valid_tenant(t)) {
            return Err(format!(
                "tenants lists {tenant:?}, which is not a tenant name"
            ));
        }
        if issuer.person_claim.is_empty() || issuer.role_claims.iter().any(String::is_empty) {
            return Err("person_claim and role_claims name claims (not empty)".to_owned());
        }
        if issuer.role_claims.is_empty() {
            return Err("role_claims names at least one claim".to_owned());
        }
        Ok(Self {
            tenant,
            person_claim: issuer.person_claim.clone(),
            role_claims: issuer.role_claims.clone(),
            roles: issuer.roles.clone(),
        })
    }

    /// The identity `claims` give.
    ///
    /// # Errors
    ///
    /// A [`Refusal`] naming the claim that is missing or wrong.
    pub(crate) fn identity(&self, claims: &Value) -> Result<Identity, Refusal> {
        let tenant = match &self.tenant {
            TenantFrom::Fixed(tenant) => tenant.clone(),
            TenantFrom::Claim { name, allowed } => tenant(name, allowed, claims)?,
        };
        let person = person(&self.person_claim, claims)?;
        let roles = self.roles_in(claims);
        if roles == Roles::default() {
            return Err(Refusal::NoRole {
                claims: self.role_claims.join(", "),
            });
        }
        Ok(Identity {
            tenant,
            person,
            roles,
        })
    }

    /// The roles the role claims give: each value through `roles`, or,
    /// without a mapping, each value that is a role's name.
    fn roles_in(&self, claims: &Value) -> Roles {
        let values = self
            .role_claims
            .iter()
            .filter_map(|name| claim(claims, name))
            .flat_map(strings);
        let mut given = Vec::new();
        for value in values {
            if self.roles.is_empty() {
                given.extend(Role::named(value));
            } else if let Some(roles) = self.roles.get(value) {
                given.extend_from_slice(roles);
            }
        }
        Roles::of(&given)
    }
}

fn tenant(name: &str, allowed: &[String], claims: &Value) -> Result<String, Refusal> {
    let missing = || Refusal::Claim {
        claim: name.to_owned(),
        why: "is missing: the issuer's mapping (tenant_claim) names the tenant with it",
    };
    let tenant = claim(claims, name).ok_or_else(missing)?;
    let tenant = tenant.as_str().ok_or_else(missing)?;
    if !is_valid_tenant(tenant) {
        return Err(Refusal::Claim {
            claim: name.to_owned(),
            why: "is not a tenant name (1 to 64 lowercase letters, digits, - and _)",
        });
    }
    if !allowed.is_empty() && !allowed.iter().any(|t| t == tenant) {
        return Err(Refusal::Claim {
            claim: name.to_owned(),
            why: "names a tenant this issuer may not name (tenants)",
        });
    }
    Ok(tenant.to_owned())
}

fn person(name: &str, claims: &Value) -> Result<String, Refusal> {
    let person = claim(claims, name)
        .and_then(Value::as_str)
        .ok_or(Refusal::Claim {
            claim: name.to_owned(),
            why: "is missing: it names the person (person_claim)",
        })?;
    let printable = !person.chars().any(char::is_control);
    if person.is_empty() || person.chars().count() > MAX_PERSON_CHARS || !printable {
        return Err(Refusal::Claim {
            claim: name.to_owned(),
            why: "is not a person's name (1 to 128 printable characters)",
        });
    }
    // The person is the submitter: one that reads as a static credential
    // would see and cancel that credential's jobs.
    if reads_as_principal(person) {
        return Err(Refusal::Claim {
            claim: name.to_owned(),
            why: "reads as a credential (token:..., client:...), not a person",
        });
    }
    Ok(person.to_owned())
}

/// The strings of a claim: an array's strings, or a string's words (as
/// `scope` writes them). Anything else gives none.
fn strings(value: &Value) -> Box<dyn Iterator<Item = &str> + '_> {
    match value {
        Value::String(text) => Box::new(text.split_whitespace()),
        Value::Array(items) => Box::new(items.iter().filter_map(Value::as_str)),
        _ => Box::new(std::iter::empty()),
    }
}

/// The claim `name`: a top-level claim of that name first (namespaced
/// claims such as `https://example.com/tenant` have dots), else the path
/// its dots spell (`realm_access.roles`).
fn claim<'a>(claims: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(value) = claims.get(name) {
        return Some(value);
    }
    name.split('.')
        .try_fold(claims, |value, part| value.get(part))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keycloak() -> IssuerOptions {
        IssuerOptions {
            issuer: "https://id.example/realms/acme".into(),
            audiences: vec!["toolfleet".into()],
            jwks_url: None,
            algorithms: vec![jsonwebtoken::Algorithm::RS256],
            tenant_claim: Some("tenant".into()),
            tenant: None,
            tenants: Vec::new(),
            person_claim: "preferred_username".into(),
            role_claims: vec!["realm_access.roles".into(), "scope".into()],
            roles: BTreeMap::new(),
        }
    }

    #[test]
    fn claims_give_a_tenant_a_person_and_roles() {
        let claims = json!({
            "tenant": "search",
            "preferred_username": "ana",
            "realm_access": {"roles": ["approver", "offline_access"]},
            "scope": "openid agent",
        });
        let identity = Mapping::of(&keycloak()).unwrap().identity(&claims).unwrap();
        assert_eq!(identity.tenant, "search");
        assert_eq!(identity.person, "ana");
        assert_eq!(identity.roles.names(), ["agent", "approver"]);
        // A fixed tenant, groups mapped to roles, a namespaced claim.
        let entra = IssuerOptions {
            tenant_claim: None,
            tenant: Some("payments".into()),
            person_claim: "https://example.com/email".into(),
            role_claims: vec!["groups".into()],
            roles: BTreeMap::from([
                (
                    "8f1c-approvers".into(),
                    vec![Role::Approver, Role::Operator],
                ),
                ("agent".into(), vec![Role::Reader]),
            ]),
            ..keycloak()
        };
        let claims = json!({
            "https://example.com/email": "ana@example.com",
            "groups": ["8f1c-approvers", "agent", "other"],
            "tenant": "ignored",
        });
        let identity = Mapping::of(&entra).unwrap().identity(&claims).unwrap();
        assert_eq!(identity.tenant, "payments");
        assert_eq!(identity.person, "ana@example.com");
        assert_eq!(
            identity.roles.names(),
            ["approver", "operator", "reader"],
            "with a mapping, a value named like a role is only what the mapping says"
        );
    }

    #[test]
    fn a_mapping_that_cannot_work_is_refused_with_the_setting_to_fix() {
        for (issuer, expected) in [
            (
                IssuerOptions {
                    tenant: Some("search".into()),
                    ..keycloak()
                },
                "exactly one of tenant_claim and tenant",
            ),
            (
                IssuerOptions {
                    tenant_claim: None,
                    tenant: Some("Search".into()),
                    ..keycloak()
                },
                "is not a tenant name",
            ),
            (
                IssuerOptions {
                    tenants: vec!["A B".into()],
                    ..keycloak()
                },
                "tenants lists \"A B\"",
            ),
            (
                IssuerOptions {
                    role_claims: Vec::new(),
                    ..keycloak()
                },
                "role_claims names at least one claim",
            ),
            (
                IssuerOptions {
                    person_claim: String::new(),
                    ..keycloak()
                },
                "person_claim and role_claims name claims",
            ),
        ] {
            let refused = Mapping::of(&issuer).unwrap_err();
            assert!(refused.contains(expected), "{refused}");
        }
    }

    #[test]
    fn a_missing_or_wrong_claim_is_refused_by_its_name() {
        let good = json!({
            "tenant": "search", "preferred_username": "ana", "scope": "agent",
        });
        let with = |key: &str, value: Value| {
            let mut claims = good.clone();
            claims[key] = value;
            claims
        };
        let without = |key: &str| {
            let mut claims = good.clone();
            claims.as_object_mut().unwrap().remove(key);
            claims
        };
        let only_search = IssuerOptions {
            tenants: vec!["search".into()],
            ..keycloak()
        };
        let identity =
            |issuer: &IssuerOptions, claims: &Value| Mapping::of(issuer).unwrap().identity(claims);
        assert!(identity(&only_search, &good).is_ok());
        for (issuer, claims, expected) in [
            (keycloak(), without("tenant"), "claim \"tenant\" is missing"),
            (
                keycloak(),
                with("tenant", json!(7)),
                "claim \"tenant\" is missing",
            ),
            (
                keycloak(),
                with("tenant", json!("Search!")),
                "is not a tenant name",
            ),
            (
                only_search,
                with("tenant", json!("ads")),
                "may not name (tenants)",
            ),
            (
                keycloak(),
                without("preferred_username"),
                "\"preferred_username\" is missing",
            ),
            (
                keycloak(),
                with("preferred_username", json!("")),
                "not a person's name",
            ),
            (
                keycloak(),
                with("preferred_username", json!("a\nb")),
                "not a person's name",
            ),
            (
                keycloak(),
                with("preferred_username", json!("token:3690a4a2ed3b26b4")),
                "reads as a credential",
            ),
            (
                keycloak(),
                with("preferred_username", json!("x".repeat(129))),
                "not a person's name",
            ),
            (
                keycloak(),
                with("scope", json!("openid profile")),
                "gives no role (claims realm_access.roles, scope:",
            ),
            (
                keycloak(),
                with("scope", json!({"agent": true})),
                "gives no role",
            ),
        ] {
            let refusal = identity(&issuer, &claims).unwrap_err().to_string();
            assert!(refusal.contains(expected), "{claims}: {refusal}");
        }
    }
}
