//! `toolfleet-orchestrator credentials --pool NAME`: what GitOps needs to
//! add a worker pool to a release whose passwords it manages
//! (`credentials.existingSecret`, docs/deploy.md): the pool's two new
//! passwords, as keys of that Secret, and their hashes, as the chart's
//! `credentials.passwordHashes` values, which may live in git.

use std::fmt::Write as _;

use rand::RngExt as _;

use crate::auth::token_sha256;

/// The bcrypt cost of the NATS password's hash: `htpasswd -bnBC 11`'s,
/// which docs/deploy.md gives for the hashes written by hand.
const BCRYPT_COST: u32 = 11;

/// Characters of a password: 32 letters and digits, 190 bits, as the
/// chart's own (`randAlphaNum 32`).
const PASSWORD_CHARS: usize = 32;

/// The longest pool name: the chart's (`definitions.name` in its schema),
/// since the name becomes part of Kubernetes objects' names.
const MAX_POOL_NAME: usize = 32;

/// A new pool's passwords and their hashes.
#[derive(Debug)]
pub struct PoolCredentials {
    pool: String,
    nats_password: String,
    redis_password: String,
    nats_bcrypt: String,
    redis_sha256: String,
}

/// Why a pool name cannot be the chart's: the rule it breaks.
///
/// # Errors
///
/// Not 1 to 32 lowercase letters, digits and `-`, starting and ending with
/// a letter or digit (the chart's schema).
pub fn check_pool_name(name: &str) -> Result<(), String> {
    checked_name(name, MAX_POOL_NAME, b"-").map_err(|name| {
        format!(
            "{name:?} is not a pool name of the chart: 1 to {MAX_POOL_NAME} lowercase letters, \
             digits and -, starting and ending with a letter or a digit"
        )
    })
}

/// Why `name` cannot be a Secret's (a DNS subdomain, as Kubernetes says),
/// which the output writes as it is.
///
/// # Errors
///
/// Not 1 to 253 lowercase letters, digits, `-` and `.`, starting and
/// ending with a letter or digit.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    checked_name(name, 253, b"-.").map_err(|name| {
        format!(
            "{name:?} is not a Secret's name: 1 to 253 lowercase letters, digits, - and ., \
             starting and ending with a letter or a digit"
        )
    })
}

/// `Ok` when `name` is 1 to `max` lowercase letters, digits and `inside`
/// bytes, starting and ending with a letter or digit, as Kubernetes names
/// are; else its first 64 characters, to quote.
fn checked_name(name: &str, max: usize, inside: &[u8]) -> Result<(), String> {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = (1..=max).contains(&bytes.len())
        && bytes.iter().all(|b| edge(b) || inside.contains(b))
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge);
    if ok {
        Ok(())
    } else {
        Err(name.chars().take(64).collect())
    }
}

impl PoolCredentials {
    /// New random passwords for `pool`, and their hashes.
    ///
    /// # Errors
    ///
    /// `pool` is not a pool name of the chart ([`check_pool_name`]).
    pub fn generate(pool: &str) -> Result<Self, String> {
        check_pool_name(pool)?;
        let (nats_password, redis_password) = (password(), password());
        let nats_bcrypt = bcrypt::hash(&nats_password, BCRYPT_COST)
            .map_err(|err| format!("cannot hash the NATS password: {err}"))?;
        // Redis's ACL takes a password's SHA-256 in hex, as a token's.
        let redis_sha256 = token_sha256(&redis_password);
        Ok(Self {
            pool: pool.to_owned(),
            nats_password,
            redis_password,
            nats_bcrypt,
            redis_sha256,
        })
    }

    /// The two YAML documents to commit, for the Secret named `secret`:
    /// the Secret's new keys (to seal, and merge into it), then the values
    /// with the hashes.
    pub fn render(&self, secret: &str) -> String {
        let Self { pool, .. } = self;
        let mut out = String::new();
        let _ = write!(
            out,
            "# The passwords of the pool {pool}: merge these keys into the Secret that\n\
             # credentials.existingSecret names (a sealed secret: kubeseal --merge-into).\n\
             # Never commit them unsealed.\n\
             apiVersion: v1\n\
             kind: Secret\n\
             metadata:\n  name: {secret}\n\
             type: Opaque\n\
             stringData:\n  nats-pool-{pool}: \"{}\"\n  redis-pool-{pool}: \"{}\"\n\
             ---\n\
             # Values: the passwords' hashes, safe to commit. Add them under\n\
             # credentials.passwordHashes, and the pool (its name, tools, replicas, ...)\n\
             # to pools; then helm upgrade (docs/deploy.md, \"Adding a pool\").\n\
             credentials:\n  existingSecret: {secret}\n  passwordHashes:\n    \
             nats:\n      pool-{pool}: \"{}\"\n    redis:\n      pool-{pool}: \"{}\"",
            self.nats_password, self.redis_password, self.nats_bcrypt, self.redis_sha256
        );
        out
    }
}

/// A random password of [`PASSWORD_CHARS`] letters and digits.
fn password() -> String {
    let mut rng = rand::rng();
    (0..PASSWORD_CHARS)
        .map(|_| char::from(rng.sample(rand::distr::Alphanumeric)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hashes_are_of_the_passwords_and_every_render_is_new() {
        let made = PoolCredentials::generate("maps").unwrap();
        assert_eq!(made.nats_password.len(), 32);
        assert!(
            made.nats_password
                .chars()
                .all(|c| c.is_ascii_alphanumeric())
        );
        assert_ne!(made.nats_password, made.redis_password);
        assert!(bcrypt::verify(&made.nats_password, &made.nats_bcrypt).unwrap());
        assert!(made.nats_bcrypt.starts_with("$2b$11$"));
        assert_eq!(made.redis_sha256, token_sha256(&made.redis_password));
        assert_eq!(made.redis_sha256.len(), 64);
        let text = made.render("fleet-passwords");
        for line in [
            "  name: fleet-passwords\n",
            &format!("  nats-pool-maps: \"{}\"\n", made.nats_password),
            &format!("  redis-pool-maps: \"{}\"\n", made.redis_password),
            &format!("      pool-maps: \"{}\"\n", made.nats_bcrypt),
            &format!("      pool-maps: \"{}\"", made.redis_sha256),
        ] {
            assert!(text.contains(line), "{text}\nlacks {line:?}");
        }
        let again = PoolCredentials::generate("maps").unwrap();
        assert_ne!(again.nats_password, made.nats_password, "random each time");
    }

    #[test]
    fn a_secret_name_kubernetes_refuses_is_refused() {
        assert_eq!(check_secret_name("fleet-passwords.v2"), Ok(()));
        for name in ["", "Fleet", "a\nb: c", "-a", "a.", &"a".repeat(254)] {
            assert!(check_secret_name(name).is_err(), "{name}");
        }
    }

    #[test]
    fn a_pool_name_the_chart_refuses_is_refused() {
        for name in ["maps", "a", "geo-2", &"x".repeat(32)] {
            assert_eq!(check_pool_name(name), Ok(()), "{name}");
        }
        for name in [
            "",
            "Maps",
            "-maps",
            "maps-",
            "ma_ps",
            "m.aps",
            &"x".repeat(33),
            "a b",
        ] {
            let why = check_pool_name(name).unwrap_err();
            assert!(why.contains("is not a pool name of the chart"), "{why}");
        }
    }
}
