//! The engine under supervision. It is launched only on weights the gate has just verified,
//! inside its tuned cgroup, bound to loopback; it is ready when `/health` answers, probed with
//! a tiny completion while it runs, restarted with exponential backoff when it dies or stops
//! answering, given up on after a crash-loop limit (the supervisor stays up and says why), and
//! stopped with SIGTERM then SIGKILL. Its state is published to a runtime file that
//! `supervisor status` reads, its output kept in a bounded ring for the dashboard.

pub mod control;
mod launch;
pub mod local;
mod logs;
pub mod probe;
mod process;
mod state;
mod supervise;

pub use control::ControlKey;
pub use launch::{ClusterHead, Launch, binary};
pub use logs::LogRing;
pub(crate) use process::spawn;
pub use process::{Finished, Running, run_to_end};
pub use state::{EngineStatus, Phase, STATE_FILE, read_status};
pub use supervise::{Handle, Serve, supervise};
