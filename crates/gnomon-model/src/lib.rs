//! A model of gnomon's attempt protocol, checked with stateright.
//! (Documentation in progress.)

pub mod model;
pub mod properties;
pub mod state;
pub mod trace;

pub use model::{Action, AttemptModel, Config, StepRule};
