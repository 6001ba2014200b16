//! The game's key-value requests, carried out against the store off the world task: the
//! core hands them over in the order its game made them (`Transmit::Kv`), this task runs
//! them one after the other in that order and gives the answers back to the world task as
//! a batch (`Command::KvAnswers`), which hands them to the game in its next round.
//!
//! Bounded by the core: at most `KV_IN_FLIGHT` requests are out per shard, so the queue
//! here (one slot per request) is never full. A store that fails answers `Failed` with
//! why; the game decides whether to ask again.

use std::sync::Arc;
use std::time::Instant;

use meridian_game::{KvAnswer, KvValue};
use meridian_store::{KvEntry, KvWrite, Store};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::command::Command;
use crate::ShardMetrics;
use meridian_shard_core::kv::{KvOp, KvReply, KvRequest, KV_IN_FLIGHT};

/// Where the world task puts the game's requests.
pub type KvRequests = mpsc::Sender<Vec<KvRequest>>;

/// The queue of requests for [`serve`], and its sending end for the world task.
pub fn queue() -> (KvRequests, mpsc::Receiver<Vec<KvRequest>>) {
    mpsc::channel(KV_IN_FLIGHT)
}

/// Carries out the requests until the world task goes.
pub async fn serve(
    store: Arc<Store>,
    mut requests: mpsc::Receiver<Vec<KvRequest>>,
    commands: mpsc::Sender<Command>,
    metrics: Arc<ShardMetrics>,
) {
    while let Some(batch) = requests.recv().await {
        let mut replies = Vec::with_capacity(batch.len());
        for request in batch {
            let started = Instant::now();
            let answer = carry_out(&store, &request).await;
            metrics.kv_seconds.observe(started.elapsed().as_secs_f64());
            if let KvAnswer::Failed(why) = &answer {
                warn!(%why, "a game key-value request failed");
            }
            replies.push(KvReply { ticket: request.ticket, key: request.key, answer });
        }
        if commands.send(Command::KvAnswers { replies }).await.is_err() {
            break;
        }
    }
    debug!("key-value task stopped");
}

async fn carry_out(store: &Store, request: &KvRequest) -> KvAnswer {
    let value = |entry: KvEntry| KvValue { value: entry.value, version: entry.version };
    match &request.op {
        KvOp::Get => match store.kv_get(&request.key).await {
            Ok(entry) => KvAnswer::Found(entry.map(value)),
            Err(error) => KvAnswer::Failed(error.to_string()),
        },
        KvOp::Set { value: new, expected } => {
            match store.kv_set(&request.key, *expected, new.as_deref()).await {
                Ok(KvWrite::Done { version }) => KvAnswer::Written { version },
                Ok(KvWrite::Conflict { current }) => KvAnswer::Conflict(current.map(value)),
                Err(error) => KvAnswer::Failed(error.to_string()),
            }
        }
    }
}
