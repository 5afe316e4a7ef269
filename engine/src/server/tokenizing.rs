//! The bound on tokenizing shared by every route that tokenizes text (chat, completions,
//! `/tokenize`): at most [`BUDGET_BYTES`] of text are tokenized at once, so however many
//! requests arrive together, tokenizing holds a bounded amount of memory (a text costs some
//! tens of times its size while it is split and encoded, and a blocking thread per request
//! would keep its memory in the allocator afterwards). A request waits its turn for at most
//! [`WAIT`], then gets 503. The control lane (the supervisor's probe and the dashboard's chat:
//! a few words each) never waits behind users.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::worker::Lane;

/// Text tokenized at once, in bytes: two of the largest texts a request may carry.
pub const BUDGET_BYTES: usize = 2 << 20;

/// The longest a request waits for its turn.
const WAIT: Duration = Duration::from_secs(30);

/// The budget is counted in KiB (a semaphore's permits are a `u32`).
const UNIT: usize = 1024;

/// The shared budget.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
}

/// A turn to tokenize: its share of the budget is given back when dropped.
pub struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(BUDGET_BYTES / UNIT)),
        }
    }
}

impl Gate {
    /// Waits until `bytes` of text may be tokenized by a request in `lane`.
    pub async fn enter(&self, bytes: usize, lane: Lane) -> Result<Turn, ApiError> {
        if lane == Lane::Control {
            return Ok(Turn { _permit: None });
        }
        // A text larger than the whole budget (refused elsewhere first) waits for all of it.
        let units = bytes.div_ceil(UNIT).clamp(1, BUDGET_BYTES / UNIT);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let permits = Arc::clone(&self.permits);
        match tokio::time::timeout(WAIT, permits.acquire_many_owned(units)).await {
            Ok(Ok(permit)) => Ok(Turn {
                _permit: Some(permit),
            }),
            Ok(Err(_)) => Err(ApiError::unavailable("the engine is shutting down")),
            Err(_) => Err(ApiError::unavailable(format!(
                "other requests have been tokenizing for {} s; retry shortly",
                WAIT.as_secs()
            ))),
        }
    }

    /// Of the budget, the bytes not in use (for tests).
    #[cfg(test)]
    fn free_bytes(&self) -> usize {
        self.permits.available_permits() * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn users_share_the_budget_and_the_control_lane_never_waits() {
        let gate = Gate::default();
        let first = gate.enter(1 << 20, Lane::User).await.expect("room");
        let second = gate.enter(1 << 20, Lane::User).await.expect("room");
        assert_eq!(gate.free_bytes(), 0);
        // The budget is spent: a third waits, and is refused when its wait runs out.
        let refused = gate.enter(10, Lane::User).await;
        assert!(refused.is_err());
        let _control = gate
            .enter(1 << 20, Lane::Control)
            .await
            .expect("never waits");
        drop(first);
        let third = gate.enter(10, Lane::User).await.expect("room again");
        drop((second, third));
        assert_eq!(gate.free_bytes(), BUDGET_BYTES);
        // A text over the whole budget still gets a turn (alone).
        let whole = gate.enter(100 << 20, Lane::User).await.expect("alone");
        assert_eq!(gate.free_bytes(), 0);
        drop(whole);
    }
}
