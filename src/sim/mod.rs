//! A deterministic simulation of node losses, played against the crate's own operations
//! (`op::Acquire`, `op::Release`, the fencing clock) and its node-loss judge through the
//! [`Nodes`](crate::round::Nodes) seam, over simulated Redis servers that run the crate's
//! Lua scripts. Seeded: a failing schedule prints its seed, and `SIM_SEED=<seed>` replays
//! it. `SIM_SCHEDULES` sets how many schedules the default run plays, `SIM_SECS` plays
//! for that long instead (the long mode), `SIM_THREADS` on that many threads (every core
//! unless set).
//!
//! ```text
//! SIM_SEED=42 cargo test --lib sim::     # replays schedule 42
//! SIM_SECS=3600 cargo test --release --lib sim::simulation -- --nocapture
//! ```

mod checkers;
mod client;
#[cfg(test)]
mod conformance;
mod conn;
mod keyspace;
mod scripting;
mod server;
mod world;

#[cfg(test)]
mod tests;
