//! What every id type of the fleet shares: text that was checked once where
//! it came in (a client's request, a message, a record in Redis) and is
//! passed as its own type from there on, so that a function deep inside
//! never takes a `&str` that might be any id.
//!
//! Each id type (`JobId`, `WireId`, `EventId`) is a `String` newtype with
//! its own constructors; `checked_id!` gives it the rest: read as `&str`, printed as its text, compared with text, written
//! to JSON as its text and read from JSON only when its check passes.

/// Implements the shared traits of the id type `$id`, a newtype over
/// `String`, whose JSON form is refused unless `$valid(&str)` holds (with
/// the error `$expected`).
macro_rules! checked_id {
    ($id:ident, $valid:expr, $expected:literal) => {
        impl std::ops::Deref for $id {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $id {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $id {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $id {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }

        impl PartialEq<str> for $id {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $id {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<$id> for String {
            fn from(id: $id) -> Self {
                id.0
            }
        }

        impl serde::Serialize for $id {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $id {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let id = String::deserialize(deserializer)?;
                let valid: fn(&str) -> bool = $valid;
                if valid(&id) {
                    Ok(Self(id))
                } else {
                    Err(serde::de::Error::custom($expected))
                }
            }
        }
    };
}

pub(crate) use checked_id;
