//! Certificates for the TLS tests: the supervisor's, which local fleets
//! with TLS (`toolfleet bench --tls`) use too.

pub use toolfleet_fleet::supervisor::certificates::*;
