//! Epoch fencing between shards: a peer batch from an older partition epoch is refused,
//! and nothing in it is applied; the same message at the current epoch is applied.

use anyhow::{ensure, Context};
use meridian_rpc::pb::{peer_message::Kind, shard_client::ShardClient, GhostUpsert};
use meridian_rpc::pb::{PeerBatch, PeerMessage};
use meridian_testkit::pb::Position;
use meridian_testkit::{Bot, ClusterOptions, Front};

use crate::with_cluster;

fn upsert(player_id: u64, name: &str, x: u32, y: u32) -> PeerMessage {
    PeerMessage {
        player_id,
        generation: 0,
        subject_seq: 0,
        kind: Some(Kind::Upsert(GhostUpsert {
            name: name.into(),
            position: Some(Position { x, y }),
            ..Default::default()
        })),
    }
}

/// Sends one batch on a fresh `Peer` stream, over mutual TLS as the shard the batch says it
/// is from (`tls`: that shard's certificate); the status code the shard answered with.
fn send_batch(
    grpc: std::net::SocketAddr,
    tls: &meridian_tls::TlsFiles,
    target: &str,
    batch: PeerBatch,
) -> anyhow::Result<tonic::Code> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let tls = meridian_tls::NodeTls::load(tls.clone())?;
    runtime.block_on(async move {
        let endpoint = meridian_tls::endpoint(&grpc.to_string(), Some(&tls), target)?;
        let mut client = ShardClient::new(endpoint.connect().await?);
        // The shard acknowledges a batch it takes, or ends the stream with an error.
        let mut acks = match client.peer(tokio_stream_once(batch)).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Ok(status.code()),
        };
        Ok(match acks.message().await {
            Ok(Some(_ack)) => tonic::Code::Ok,
            Ok(None) => tonic::Code::Unknown,
            Err(status) => status.code(),
        })
    })
}

fn tokio_stream_once(
    batch: PeerBatch,
) -> impl tonic::codegen::tokio_stream::Stream<Item = PeerBatch> {
    tonic::codegen::tokio_stream::iter([batch])
}

pub fn stale_epoch_is_refused(io: Front) {
    with_cluster(ClusterOptions::new(io).shards(2), |cluster| {
        let status = cluster.status_json()?;
        let epoch = status["partition"]["epoch"].as_u64().context("partition epoch")?;
        ensure!(epoch >= 1, "a partition is published: {status}");
        // Shard ids come from the ready file; pretend to be the other one.
        let target = cluster.shard(0);
        let pretend = cluster.shard(1).id;
        let as_peer = cluster.tls_files(&format!("shard-{pretend}"))?;
        let target_name = format!("shard-{}", target.id);
        let mut watcher = Bot::connect(cluster.client_addr(0))?;
        // Somewhere shard `target` owns, whatever the layout: its own region's corner.
        let regions = status["partition"]["regions"].as_array().context("regions")?;
        let mine = regions
            .iter()
            .find(|r| r["shard"].as_u64() == Some(u64::from(target.id)))
            .context("target shard's region")?;
        let (x, y) = (
            mine["x0"].as_u64().unwrap_or(0) as u32 + 5,
            mine["y0"].as_u64().unwrap_or(0) as u32 + 5,
        );
        watcher.login("watcher", Some((x, y)))?;

        let stale = PeerBatch {
            seq: 1,
            incarnation: 1,
            from_shard: pretend,
            epoch: epoch - 1,
            messages: vec![upsert(900_001, "stale", x + 1, y)],
        };
        let code = send_batch(target.grpc, &as_peer, &target_name, stale)?;
        ensure!(code == tonic::Code::FailedPrecondition, "a stale-epoch batch got {code:?}");
        let seen = watcher.ping_barrier()?;
        ensure!(seen.is_empty(), "the refused batch was applied: {seen:?}");

        let current = PeerBatch {
            seq: 2,
            incarnation: 1,
            from_shard: pretend,
            epoch,
            messages: vec![upsert(900_002, "fresh", x + 1, y)],
        };
        let code = send_batch(target.grpc, &as_peer, &target_name, current)?;
        ensure!(code == tonic::Code::Ok, "a current-epoch batch got {code:?}");
        let entered = watcher.recv_until(meridian_testkit::deadline(meridian_testkit::DEFAULT_WAIT), "the ghost from the current-epoch batch", |m| {
            matches!(&m.kind, Some(meridian_testkit::pb::server_message::Kind::Entered(e)) if e.player_id == 900_002)
        });
        entered.map(|_| ())
    })
}
