//! Start-up patience: a node that starts while etcd is slow (a stalled disk, an election
//! in etcd, a restart) waits for it instead of exiting on the first request that times out.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::ClusterError;

/// How long a node's start-up requests keep trying while etcd does not answer.
pub const START_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `attempt` until etcd answers it, for at most `patience`: while etcd is unreachable
/// or a request times out ([`ClusterError::Unreachable`]) it is tried again, with a warning
/// each time and a backoff from 250 ms to 2 s. Any other outcome, an answer or a refusal
/// (a missing permission, a conflict), is returned at once; so is the last error when
/// patience runs out.
pub async fn until_etcd_answers<T, F, Fut>(
    what: &str,
    patience: Duration,
    mut attempt: F,
) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClusterError>>,
{
    let give_up = Instant::now() + patience;
    let mut backoff = Duration::from_millis(250);
    let mut tries = 0u32;
    loop {
        tries += 1;
        match attempt().await {
            Err(error @ ClusterError::Unreachable(_)) if Instant::now() + backoff < give_up => {
                warn!(%error, tries, "{what}: etcd did not answer; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> ClusterError {
        ClusterError::Unreachable(etcd_client::Error::InvalidArgs("down".into()))
    }

    #[tokio::test(start_paused = true)]
    async fn unreachable_is_waited_for_and_a_refusal_is_not() {
        let mut calls = 0;
        let answered = until_etcd_answers("test", START_PATIENCE, || {
            calls += 1;
            let outcome = if calls < 4 { Err(unreachable()) } else { Ok(calls) };
            async move { outcome }
        })
        .await;
        assert_eq!(answered.ok(), Some(4));

        let mut calls = 0;
        let refused: Result<(), _> = until_etcd_answers("test", START_PATIENCE, || {
            calls += 1;
            async { Err(ClusterError::Conflict("key".into())) }
        })
        .await;
        assert!(matches!(refused, Err(ClusterError::Conflict(_))));
        assert_eq!(calls, 1, "a refusal is not tried again");
    }

    #[tokio::test(start_paused = true)]
    async fn patience_runs_out() {
        let started = Instant::now();
        let outcome: Result<(), _> =
            until_etcd_answers("test", Duration::from_secs(10), || async { Err(unreachable()) })
                .await;
        assert!(matches!(outcome, Err(ClusterError::Unreachable(_))));
        assert!(started.elapsed() <= Duration::from_secs(10));
    }
}
