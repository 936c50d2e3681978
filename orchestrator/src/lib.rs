//! The toolfleet orchestrator: the gRPC API, the model loop and the dispatcher.
//!
//! A placeholder until the orchestrator lands; the contracts it will implement
//! are in `toolfleet-proto`.
