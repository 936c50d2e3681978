//! Which release a process plays: this one, or, in the tests of a mixed
//! fleet only, the one before (issue 56).
//!
//! The tests of upgrades run this release's binaries side by side with
//! processes that behave as the release before did, instead of compiling
//! that release a second time. Such a process:
//! - writes format 1 (decision 0059): no `Toolfleet-Format` header, no
//!   `format` field in a job's hash or a ledger record;
//! - reads every record and message as the release before did, whatever
//!   format it says (that release knew no formats);
//! - does not pin (decision 0058): its calls carry no
//!   `Toolfleet-Tool-Version`, its workers run a call of any version and
//!   take a `Toolfleet-Version-Gone` notice for a plain delivery, its
//!   orchestrators retire nothing, and neither names a version in a
//!   record or an event.
//!
//! The switch, `TOOLFLEET_TEST_PREVIOUS_RELEASE=1`, exists only in builds
//! with the `previous-release` feature (the tests' builds, with
//! `--all-features`); a release build always plays this release, whatever
//! its environment says. A process that plays the release before says so
//! in a warning as it starts, which the tests look for.

/// The variable that makes a process of a test build play the release
/// before.
pub const PREVIOUS_RELEASE_ENV: &str = "TOOLFLEET_TEST_PREVIOUS_RELEASE";

/// Whether this process plays the release before this one (see the
/// module's docs). Read once: a process never changes release.
#[cfg(feature = "previous-release")]
pub fn is_previous() -> bool {
    static PREVIOUS: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var_os(PREVIOUS_RELEASE_ENV).is_some_and(|value| value == "1")
    });
    *PREVIOUS
}

/// Whether this process plays the release before this one: never, in a
/// build without the `previous-release` feature.
#[cfg(not(feature = "previous-release"))]
pub const fn is_previous() -> bool {
    false
}
