//! Roles: what a credential may do in its tenant, the same whatever the
//! credential (docs/security.md, "Roles"), and what each RPC needs.
//!
//! [`granted`] says which roles a token or client name has, from its
//! tenant's entry in the tokens file; [`Rpc::needs`] says which roles an
//! RPC accepts. Both are pure, with table tests.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One role of a credential in its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Submits jobs, and watches and cancels those it submitted (all the
    /// tenant's with `operator` or `reader`: `Caller::sight`); lists its
    /// tools.
    Agent,
    /// Lists the tenant's calls held for approval, and decides them.
    Approver,
    /// Resolves unknown outcomes (verdicts), cancels any job of the tenant,
    /// sees every job; lists its tools with the fleet's details
    /// (decision 0052).
    Operator,
    /// Reads: every job of the tenant, its events and trace; its tools,
    /// with the fleet's details.
    Reader,
}

impl Role {
    const ALL: [Role; 4] = [Role::Agent, Role::Approver, Role::Operator, Role::Reader];

    /// The role as the tokens file and errors spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Approver => "approver",
            Self::Operator => "operator",
            Self::Reader => "reader",
        }
    }

    /// The role spelled `name`, if any.
    pub(crate) fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Roles(u8);

impl Roles {
    /// Every role: a tenant that names no roles, or no authentication.
    pub(crate) const ALL: Roles = Roles(0b1111);

    /// The set of `roles`.
    pub(crate) fn of(roles: &[Role]) -> Self {
        Self(roles.iter().fold(0, |set, role| set | role.bit()))
    }

    /// Whether the set holds `role`.
    pub(crate) fn has(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// Whether the set holds any of `roles`.
    pub(crate) fn any(self, roles: &[Role]) -> bool {
        roles.iter().any(|&role| self.has(role))
    }

    /// Whether `ListTools` tells these roles the fleet's details (pools,
    /// calls waiting, unavailable workers and tools, MCP servers): with
    /// `operator` or `reader`, who watch the fleet. A queue's depth is the
    /// whole fleet's, shared by every tenant's jobs, so an agent is not
    /// told it (decision 0052).
    pub(crate) fn see_the_fleet(self) -> bool {
        self.any(&[Role::Operator, Role::Reader])
    }
}

impl Roles {
    /// The roles in the set, as the tokens file spells them, in a fixed
    /// order.
    pub(crate) fn names(self) -> Vec<&'static str> {
        Role::ALL
            .iter()
            .filter(|&&role| self.has(role))
            .map(|role| role.as_str())
            .collect()
    }
}

impl fmt::Display for Roles {
    /// `agent, reader`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        match names.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&names.join(", ")),
        }
    }
}

/// The roles of the credential `key` (a token's SHA-256 in hex, or a client
/// name) of a tenant whose entry gives `roles` and names `approvers`:
/// - a tenant that gives roles: the credential's, none if it is not listed;
/// - else a tenant that names approvers (the form before roles): an approver
///   is `approver` and `operator`, what it could do then; any other
///   credential is `agent` and `reader`;
/// - else every role, as before roles existed.
pub(crate) fn granted(
    roles: &BTreeMap<String, Vec<Role>>,
    approvers: &BTreeMap<String, String>,
    key: &str,
) -> Roles {
    if !roles.is_empty() {
        return roles.get(key).map_or_else(Roles::default, |r| Roles::of(r));
    }
    if approvers.is_empty() {
        return Roles::ALL;
    }
    match approvers.contains_key(key) {
        true => Roles::of(&[Role::Approver, Role::Operator]),
        false => Roles::of(&[Role::Agent, Role::Reader]),
    }
}

/// An RPC of `toolfleet.v1.AgentService`, as far as roles go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rpc {
    /// `SubmitJob`.
    SubmitJob,
    /// `GetJob`, `WatchJob`, `ListJobs`.
    ReadJobs,
    /// `CancelJob`.
    CancelJob,
    /// `ListTools`.
    ListTools,
    /// `DecideCall` on a call held for approval.
    DecideApproval,
    /// `DecideCall` on an attempt whose outcome is unknown (a verdict).
    DecideVerdict,
    /// `ListPendingApprovals`: approvals for an approver, verdicts for an
    /// operator.
    ListPending,
}

impl Rpc {
    /// The roles any one of which lets a caller make this call.
    pub(crate) fn needs(self) -> &'static [Role] {
        match self {
            Self::SubmitJob => &[Role::Agent],
            Self::ReadJobs => &[Role::Agent, Role::Operator, Role::Reader],
            Self::CancelJob => &[Role::Agent, Role::Operator],
            Self::ListTools => &[Role::Agent, Role::Operator, Role::Reader],
            Self::DecideApproval => &[Role::Approver],
            Self::DecideVerdict => &[Role::Operator],
            Self::ListPending => &[Role::Approver, Role::Operator],
        }
    }

    /// The RPC's name, as errors say it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::SubmitJob => "SubmitJob",
            Self::ReadJobs => "reading jobs",
            Self::CancelJob => "CancelJob",
            Self::ListTools => "ListTools",
            Self::DecideApproval => "DecideCall on a held call",
            Self::DecideVerdict => "DecideCall on an unknown outcome",
            Self::ListPending => "ListPendingApprovals",
        }
    }

    /// The roles it needs, as errors say them: `agent`, `agent or reader`.
    pub(crate) fn needs_text(self) -> String {
        let names: Vec<&str> = self.needs().iter().map(|role| role.as_str()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::{Agent, Approver, Operator, Reader};

    fn map<V: Clone>(pairs: &[(&str, V)]) -> BTreeMap<String, V> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect()
    }

    #[test]
    fn a_credential_gets_its_roles_from_its_tenants_entry() {
        let (none, nobody) = (BTreeMap::new(), BTreeMap::new());
        let given = map(&[("ops", vec![Operator, Reader]), ("bot", vec![Agent])]);
        let approvers = map(&[("ana", "Ana Lima".to_owned())]);
        let rows = [
            // No roles, no approvers: every credential may do everything.
            (&none, &nobody, "bot", Roles::ALL),
            // Roles given: each credential its own; one not listed, none.
            (&given, &nobody, "ops", Roles::of(&[Operator, Reader])),
            (&given, &nobody, "bot", Roles::of(&[Agent])),
            (&given, &nobody, "stranger", Roles::default()),
            // Roles win over the approvers form, which then only names.
            (&given, &approvers, "ana", Roles::default()),
            // The approvers form: approvers approve and operate, the rest
            // submit and read.
            (&none, &approvers, "ana", Roles::of(&[Approver, Operator])),
            (&none, &approvers, "bot", Roles::of(&[Agent, Reader])),
        ];
        for (roles, approvers, key, expected) in rows {
            assert_eq!(granted(roles, approvers, key), expected, "{key}");
        }
    }

    #[test]
    fn each_rpc_needs_its_roles() {
        let rows = [
            (Rpc::SubmitJob, "agent"),
            (Rpc::ReadJobs, "agent, operator or reader"),
            (Rpc::CancelJob, "agent or operator"),
            (Rpc::ListTools, "agent, operator or reader"),
            (Rpc::DecideApproval, "approver"),
            (Rpc::DecideVerdict, "operator"),
            (Rpc::ListPending, "approver or operator"),
        ];
        for (rpc, needs) in rows {
            assert_eq!(rpc.needs_text(), needs, "{rpc:?}");
        }
        // Every role opens something, and only `agent` submits.
        for role in Role::ALL {
            let only = Roles::of(&[role]);
            assert!(
                rows.iter().any(|(rpc, _)| only.any(rpc.needs())),
                "{role:?}"
            );
            assert_eq!(only.any(Rpc::SubmitJob.needs()), role == Agent);
        }
    }

    #[test]
    fn operators_and_readers_see_the_fleet() {
        let rows = [
            (Roles::of(&[Agent]), false),
            (Roles::of(&[Approver]), false),
            (Roles::of(&[Agent, Approver]), false),
            (Roles::of(&[Operator]), true),
            (Roles::of(&[Reader]), true),
            (Roles::of(&[Agent, Reader]), true),
            (Roles::ALL, true),
            (Roles::default(), false),
        ];
        for (roles, sees) in rows {
            assert_eq!(roles.see_the_fleet(), sees, "{roles}");
            // Whoever sees the fleet may ask ListTools.
            assert!(!sees || roles.any(Rpc::ListTools.needs()), "{roles}");
        }
    }

    #[test]
    fn roles_read_and_print_as_the_tokens_file_spells_them() {
        let read: Vec<Role> = serde_json::from_str(r#"["agent","approver","operator","reader"]"#)
            .expect("the four roles");
        assert_eq!(Roles::of(&read), Roles::ALL);
        assert!(serde_json::from_str::<Role>(r#""admin""#).is_err());
        assert_eq!(Roles::of(&[Reader, Agent]).to_string(), "agent, reader");
        assert_eq!(Roles::default().to_string(), "none");
    }
}
