//! Mutual TLS on the gRPC links of a `meridian up` cluster (issue 15): a shard takes a
//! `Relay` only from the gateway its client certificate names and a `Peer` only from the
//! shard its certificate names; anyone else, with no certificate or one from another CA,
//! does not get in. Certificates renewed in place are used by new connections, and the
//! players already playing notice nothing.

use anyhow::{bail, ensure, Context};
use meridian_rpc::pb::shard_client::ShardClient;
use meridian_rpc::pb::{GatewayBatch, PeerBatch};
use meridian_testkit::pb::Direction;
use meridian_testkit::{metric_total, Bot, ClusterOptions, Front};
use tokio_stream::StreamExt as _;

use crate::with_cluster;

/// What a shard answered a stream opened as `claimed` (`Relay` for a `gateway-N`, `Peer`
/// for a `shard-N`) over TLS with `files`' certificate: `Ok(())` if it took the stream,
/// the gRPC code otherwise (`Unavailable` when the handshake itself failed).
async fn open_as(
    grpc: std::net::SocketAddr,
    files: meridian_tls::TlsFiles,
    claimed: &str,
) -> anyhow::Result<Result<(), tonic::Code>> {
    let tls = meridian_tls::NodeTls::load(files)?;
    let endpoint = meridian_tls::endpoint(&grpc.to_string(), Some(&tls), "shard-1")?;
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(_) => return Ok(Err(tonic::Code::Unavailable)),
    };
    let mut client = ShardClient::new(channel);
    let (kind, id) = claimed.split_once('-').context("a node name")?;
    let id: u32 = id.parse()?;
    let answer = match kind {
        "gateway" => {
            let hello = GatewayBatch { gateway_id: id, inputs: Vec::new() };
            let outbound = tokio_stream::iter(vec![hello]).chain(tokio_stream::pending());
            match client.relay(outbound).await {
                Ok(response) => {
                    // The shard checks the hello before it answers with the stream.
                    let mut inbound = response.into_inner();
                    let first = tokio::time::timeout(
                        std::time::Duration::from_millis(500),
                        inbound.message(),
                    )
                    .await;
                    match first {
                        Ok(Err(status)) => Err(status.code()),
                        _ => Ok(()),
                    }
                }
                Err(status) => Err(status.code()),
            }
        }
        "shard" => {
            let batch = PeerBatch {
                from_shard: id,
                epoch: 0,
                seq: 1,
                incarnation: 1,
                messages: Vec::new(),
            };
            let outbound = tokio_stream::iter(vec![batch]).chain(tokio_stream::pending());
            match client.peer(outbound).await {
                Ok(response) => match response.into_inner().message().await {
                    // Past the identity check, the batch's epoch 0 is refused as stale: the
                    // shard took the stream.
                    Ok(_) => Ok(()),
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => Ok(()),
                    Err(status) => Err(status.code()),
                },
                Err(status) => Err(status.code()),
            }
        }
        other => bail!("not a node kind: {other}"),
    };
    Ok(answer)
}

pub fn a_shard_takes_streams_only_from_the_node_its_certificate_names(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let grpc = cluster.shard(0).grpc;
        let mut alice = Bot::connect(cluster.client_addr(0))?;
        alice.login("alice", Some((50, 50)))?;

        let gateway_7 = cluster.tls_files("gateway-7")?;
        let shard_9 = cluster.tls_files("shard-9")?;
        let cases = [
            (gateway_7.clone(), "gateway-7", Ok(())),
            (gateway_7.clone(), "gateway-1", Err(tonic::Code::PermissionDenied)),
            (shard_9.clone(), "gateway-9", Err(tonic::Code::PermissionDenied)),
            (shard_9.clone(), "shard-9", Ok(())),
            (shard_9.clone(), "shard-2", Err(tonic::Code::PermissionDenied)),
            (gateway_7.clone(), "shard-7", Err(tonic::Code::PermissionDenied)),
        ];
        for (files, claimed, expected) in cases {
            let name = files.cert.file_name().map(|n| n.to_string_lossy().into_owned());
            let answer = runtime.block_on(open_as(grpc, files, claimed))?;
            ensure!(
                answer == expected,
                "a stream claiming {claimed} with {name:?}: expected {expected:?}, got {answer:?}"
            );
        }

        // An expired certificate of the right CA and name does not get through either.
        let tls_dir = gateway_7.ca.parent().context("the CA's directory")?;
        let expired = meridian_tls::DevCa::open_or_create(tls_dir)?.issue_expired("gateway-1")?;
        let answer = runtime.block_on(open_as(grpc, expired, "gateway-1"))?;
        ensure!(answer.is_err(), "an expired certificate got in: {answer:?}");
        // A certificate from another CA does not get through the handshake.
        let elsewhere = cluster.dir().join("another-ca");
        let stranger = meridian_tls::DevCa::open_or_create(&elsewhere)?.issue("gateway-1")?;
        let stranger = meridian_tls::TlsFiles { ca: gateway_7.ca.clone(), ..stranger };
        let answer = runtime.block_on(open_as(grpc, stranger, "gateway-1"))?;
        ensure!(answer.is_err(), "a certificate from another CA got in: {answer:?}");
        // Nor does a plain-text client.
        let plain = runtime.block_on(async {
            let endpoint = meridian_tls::endpoint(&grpc.to_string(), None, "shard-1")?;
            let channel = endpoint.connect().await?;
            let batch = GatewayBatch { gateway_id: 1, inputs: Vec::new() };
            let outbound = tokio_stream::iter(vec![batch]);
            Ok::<_, anyhow::Error>(ShardClient::new(channel).relay(outbound).await.is_ok())
        });
        ensure!(!matches!(plain, Ok(true)), "a plain-text Relay was taken");
        let refused = metric_total(cluster.shard(0).admin, "meridian_tls_refused_total")?;
        ensure!(refused >= 7.0, "refusals are counted: {refused}");

        // Renewed in place under load (cert-manager's way): every node's certificate
        // renewed while players walk; new connections use the new files, and nobody playing
        // notices: every move is answered, nobody is cut.
        let mut players = vec![alice];
        for i in 0..11u32 {
            let mut bot = Bot::connect(cluster.client_addr(0))?;
            bot.login(&format!("walker-{i}"), Some((60 + 3 * i, 60)))?;
            players.push(bot);
        }
        let renewals_before = metric_total(cluster.shard(0).admin, "meridian_tls_reloads_total")?;
        let ca = meridian_tls::DevCa::open_or_create(tls_dir)?;
        let shards = cluster.shards().len();
        for t in 1..=8u64 {
            if t == 4 {
                for id in 1..=shards {
                    ca.issue(&format!("shard-{id}"))?;
                }
                ca.issue("gateway-1")?;
            }
            let direction = if t % 2 == 1 { Direction::Down } else { Direction::Up };
            for (i, player) in players.iter_mut().enumerate() {
                player.move_ok(direction, t).with_context(|| format!("player {i}, move {t}"))?;
            }
        }
        let answer =
            runtime.block_on(open_as(grpc, cluster.tls_files("gateway-7")?, "gateway-7"))?;
        ensure!(answer.is_ok(), "a new connection after the renewal: {answer:?}");
        let renewals = metric_total(cluster.shard(0).admin, "meridian_tls_reloads_total")?;
        ensure!(renewals > renewals_before, "the shard read its renewed files: {renewals}");
        let cut = metric_total(cluster.shard(0).admin, "meridian_shard_gateway_links_cut_total")?;
        ensure!(cut == 0.0, "no gateway link was cut: {cut}");
        Ok(())
    });
}
