//! Mutual TLS on the links of a `meridian up` cluster (issue 15): a shard takes a relay link
//! only from the gateway its client certificate names and a `Peer` stream only from the
//! shard its certificate names; anyone else, with no certificate or one from another CA,
//! does not get in. Certificates renewed in place are used by new connections, and the
//! players already playing notice nothing.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_rpc::link::{next_frame, put_frame, MAGIC};
use meridian_rpc::pb::shard_client::ShardClient;
use meridian_rpc::pb::{GatewayBatch, PeerBatch, ShardBatch};
use meridian_testkit::pb::Direction;
use meridian_testkit::{metric_total, Bot, ClusterOptions, Front};
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_stream::StreamExt as _;

use crate::with_cluster;

/// What a shard answered a relay link or a `Peer` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// It took it.
    Taken,
    /// It refused it for the name it claimed: a link's `refused` frame, or a stream's
    /// `PERMISSION_DENIED`.
    NotThatNode,
    /// It let nothing in: the handshake failed, or the connection ended without a word.
    Shut,
    /// Some other refusal.
    Other(String),
}

/// How long a refusal or a heartbeat takes at most to arrive.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// What a shard answered a link or stream opened as `claimed` (a relay link for a
/// `gateway-N`, a `Peer` stream for a `shard-N`) over TLS with `files`' certificate.
async fn open_as(
    grpc: std::net::SocketAddr,
    files: meridian_tls::TlsFiles,
    claimed: &str,
) -> anyhow::Result<Answer> {
    let tls = meridian_tls::NodeTls::load(files)?;
    let (kind, id) = claimed.split_once('-').context("a node name")?;
    let id: u32 = id.parse()?;
    match kind {
        "gateway" => {
            // A relay link, as a gateway's worker opens it: TLS with the relay ALPN, then the
            // magic and the hello.
            let tcp = tokio::net::TcpStream::connect(grpc).await?;
            let connector = tokio_rustls::TlsConnector::from(tls.relay_client_config());
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("shard-1")?;
            match connector.connect(name, tcp).await {
                Ok(stream) => link_answer(stream, id).await,
                Err(_) => Ok(Answer::Shut),
            }
        }
        "shard" => {
            let endpoint = meridian_tls::endpoint(&grpc.to_string(), Some(&tls), "shard-1")?;
            let channel = match endpoint.connect().await {
                Ok(channel) => channel,
                Err(_) => return Ok(Answer::Shut),
            };
            let batch = PeerBatch {
                from_shard: id,
                epoch: 0,
                seq: 1,
                incarnation: 1,
                messages: Vec::new(),
            };
            let outbound = tokio_stream::iter(vec![batch]).chain(tokio_stream::pending());
            let refused = |status: tonic::Status| match status.code() {
                tonic::Code::PermissionDenied => Answer::NotThatNode,
                tonic::Code::Unavailable => Answer::Shut,
                code => Answer::Other(format!("{code:?}: {}", status.message())),
            };
            Ok(match ShardClient::new(channel).peer(outbound).await {
                Ok(response) => match response.into_inner().message().await {
                    // Past the identity check, the batch's epoch 0 is refused as stale: the
                    // shard took the stream.
                    Ok(_) => Answer::Taken,
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        Answer::Taken
                    }
                    Err(status) => refused(status),
                },
                Err(status) => refused(status),
            })
        }
        other => bail!("not a node kind: {other}"),
    }
}

/// Says hello on a relay link as gateway `gateway` (lane 0) and reads the shard's first
/// frame: a refusal, or (the link taken) a heartbeat or output.
async fn link_answer(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    gateway: u32,
) -> anyhow::Result<Answer> {
    let mut hello = MAGIC.to_vec();
    put_frame(&mut hello, &GatewayBatch { gateway_id: gateway, lane: 0, inputs: Vec::new() });
    if stream.write_all(&hello).await.is_err() || stream.flush().await.is_err() {
        return Ok(Answer::Shut);
    }
    let mut buf = Vec::new();
    loop {
        let frame = match next_frame(&buf) {
            Ok(frame) => frame,
            // Not frames at all (a TLS alert to a client that did not speak TLS, say).
            Err(too_long) => return Ok(Answer::Other(too_long.to_string())),
        };
        if let Some((_, body)) = frame {
            let first = match ShardBatch::decode(body) {
                Ok(first) => first,
                Err(error) => return Ok(Answer::Other(error.to_string())),
            };
            return Ok(if first.refused.is_empty() {
                Answer::Taken
            } else if first.refused.contains(&format!("does not name gateway-{gateway}")) {
                Answer::NotThatNode
            } else {
                Answer::Other(first.refused)
            });
        }
        match tokio::time::timeout(ANSWER_WITHIN, stream.read_buf(&mut buf)).await {
            Err(_) => bail!("the shard said nothing on the link for {ANSWER_WITHIN:?}"),
            Ok(Ok(0) | Err(_)) => return Ok(Answer::Shut),
            Ok(Ok(_)) => {}
        }
    }
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
            (gateway_7.clone(), "gateway-7", Answer::Taken),
            (gateway_7.clone(), "gateway-1", Answer::NotThatNode),
            (shard_9.clone(), "gateway-9", Answer::NotThatNode),
            (shard_9.clone(), "shard-9", Answer::Taken),
            (shard_9.clone(), "shard-2", Answer::NotThatNode),
            (gateway_7.clone(), "shard-7", Answer::NotThatNode),
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
        ensure!(answer != Answer::Taken, "an expired certificate got in");
        // A certificate from another CA does not get through the handshake.
        let elsewhere = cluster.dir().join("another-ca");
        let stranger = meridian_tls::DevCa::open_or_create(&elsewhere)?.issue("gateway-1")?;
        let stranger = meridian_tls::TlsFiles { ca: gateway_7.ca.clone(), ..stranger };
        let answer = runtime.block_on(open_as(grpc, stranger, "gateway-1"))?;
        ensure!(answer != Answer::Taken, "a certificate from another CA got in");
        // Nor does a plain-text link.
        let plain = runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(grpc).await?;
            link_answer(tcp, 1).await
        })?;
        ensure!(plain != Answer::Taken, "a plain-text relay link was taken");
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
        ensure!(answer == Answer::Taken, "a new connection after the renewal: {answer:?}");
        let renewals = metric_total(cluster.shard(0).admin, "meridian_tls_reloads_total")?;
        ensure!(renewals > renewals_before, "the shard read its renewed files: {renewals}");
        let cut = metric_total(cluster.shard(0).admin, "meridian_shard_gateway_links_cut_total")?;
        ensure!(cut == 0.0, "no gateway link was cut: {cut}");
        Ok(())
    });
}
