#![recursion_limit = "512"]
//! gnomon-server: the leader runtime (trigger, dispatch, retry,
//! cancellation), the REST API, metrics and the UI.

pub mod api;
pub mod auth;
pub mod browser;
mod cluster_api;
pub mod leader;
pub mod leader_time;
pub mod listener;
pub mod live;
pub mod metrics_setup;
pub mod node;
pub mod notifier;
pub mod openapi;
mod outbound;
pub mod server;
pub mod sessions;
pub mod signing;
mod ui;

pub use node::{Node, NodeConfig, NodeHandle};
