//! `meridian player show|kick|move ACCOUNT`: an operator's hand on one account's player.
//!
//! The account is looked up in the player store; where the player is online comes from the
//! shards' `/players`. Orders reach the shard holding the player through etcd (a key under
//! `/meridian/<cluster>/order/<player id>`, leased for a minute): who can write the
//! cluster's etcd prefix can give them, exactly as for `meridian drain`. A player that is
//! not online is moved in the store, where its next login finds it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use etcd_client::PutOptions;
use meridian_cluster::{ClusterKeys, ClusterView, ClusterWatch, OrderKind, PlayerOrder, ShardId};
use serde::Deserialize;

use crate::cli::{PlayerAction, PlayerArgs};

/// How long an order stays in etcd: long enough for every shard to see it.
const ORDER_LEASE_SECS: i64 = 60;
/// How long the command waits to see an order carried out.
/// How many times an order is written before giving up (each a 5 s request).
const ORDER_WRITE_ATTEMPTS: u32 = 3;
const WAIT_FOR_ORDER: Duration = Duration::from_secs(10);
/// How long the command waits for a slow etcd (a busy disk can hold a request past its
/// 5 s timeout) before it gives up.
const ETCD_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
struct ShardPlayers {
    players: Vec<Listed>,
}

#[derive(Deserialize)]
struct Listed {
    id: u64,
    x: u32,
    y: u32,
}

pub fn run(args: PlayerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let spec = args
            .store
            .as_deref()
            .context("which player store? --store ADDR (or MERIDIAN_STORE), as the cluster's")?;
        let store = meridian_store::Store::open(&meridian_store::Address::parse(spec)?)
            .await
            .with_context(|| format!("opening the player store {spec}"))?;
        let account = match &args.action {
            PlayerAction::Show { account }
            | PlayerAction::Kick { account, .. }
            | PlayerAction::Move { account, .. } => account.clone(),
        };
        let player = store
            .find(&account)
            .await?
            .with_context(|| format!("no account {account:?} in the player store"))?;
        let id = player.player_id;
        let keys = ClusterKeys::new(&args.cluster.cluster);
        let token = args.cluster.token.admin_token.as_deref();
        let mut client = meridian_cluster::connect(&args.cluster.etcd_access.etcd(&args.cluster.etcd))
            .await
            .with_context(|| format!("connecting to etcd at {}", args.cluster.etcd.join(",")))?;
        let watch = meridian_cluster::until_etcd_answers("reading the cluster", ETCD_PATIENCE, || {
            ClusterWatch::start(client.clone(), keys.clone())
        })
        .await?;
        let view = watch.current();
        let online = where_online(&view, id, token).await;
        let kind = match args.action {
            PlayerAction::Show { .. } => {
                println!("account   {account}");
                println!("player    {id}");
                println!("name      {}", player.name);
                match &player.saved {
                    Some(saved) => println!(
                        "saved     at ({}, {}), generation {}, state {} bytes",
                        saved.at.0,
                        saved.at.1,
                        saved.generation,
                        saved.state.len()
                    ),
                    None => println!("saved     never"),
                }
                match online {
                    Some((shard, x, y)) => println!("online    on {shard} at ({x}, {y})"),
                    None => println!("online    no"),
                }
                return Ok(());
            }
            PlayerAction::Kick { reason, .. } => OrderKind::Kick { reason },
            PlayerAction::Move { x, y, .. } => {
                let size = view.partition.as_ref().map(|p| (p.width, p.height));
                if let Some((width, height)) = size.filter(|&(w, h)| x >= w || y >= h) {
                    bail!("({x}, {y}) is outside the {width}x{height} map");
                }
                OrderKind::Move { x, y }
            }
        };
        // Given whether or not the player is listed: a player parked after a dropped
        // connection is not, and the shard parking it carries the order out too.
        let order_id = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
        let order = PlayerOrder { id: order_id, kind: kind.clone() };
        let lease = meridian_cluster::until_etcd_answers("granting the order's lease", ETCD_PATIENCE, || {
            let mut client = client.clone();
            async move {
                client
                    .lease_grant(ORDER_LEASE_SECS, None)
                    .await
                    .map_err(meridian_cluster::ClusterError::from_etcd)
            }
        })
        .await?
        .id();
        // A slow etcd (a busy disk) can outlast one request's timeout. Writing the same
        // order again is harmless: shards carry out each order id once.
        let body = serde_json::to_string(&order)?;
        let mut attempt = 1;
        loop {
            let options = Some(PutOptions::new().with_lease(lease));
            match client.put(keys.order(id), body.clone(), options).await {
                Ok(_) => break,
                Err(error) if attempt < ORDER_WRITE_ATTEMPTS => {
                    eprintln!("writing the order (attempt {attempt}): {error}; trying again");
                    attempt += 1;
                }
                Err(error) => return Err(error).context("writing the order"),
            }
        }
        match (kind, online) {
            (OrderKind::Kick { .. }, None) => {
                println!("{account} (player {id}) is not online; a parked copy is removed too")
            }
            (OrderKind::Kick { .. }, Some((shard, ..))) => {
                wait_for(&view, id, token, |at| at.is_none()).await.with_context(|| {
                    format!("{account} (player {id}) is still online after the kick")
                })?;
                println!("{account} (player {id}) kicked from {shard}");
            }
            (OrderKind::Move { x, y }, None) => {
                store.place(id, (x, y)).await?;
                println!("{account} (player {id}) is not online; it comes back at ({x}, {y})");
            }
            (OrderKind::Move { x, y }, Some(_)) => {
                let moved = wait_for(&view, id, token, |at| at.is_some_and(|(_, ax, ay)| (ax, ay) == (x, y)))
                    .await;
                moved.with_context(|| {
                    format!("{account} (player {id}) was not moved (it may have changed shards: try again)")
                })?;
                println!("{account} (player {id}) moved to ({x}, {y})");
            }
        }
        Ok(())
    })
}

/// Which shard lists `player` among its players, and where.
async fn where_online(
    view: &ClusterView,
    player: u64,
    token: Option<&str>,
) -> Option<(ShardId, u32, u32)> {
    for (shard, record) in &view.shards {
        let Some((200, body)) = meridian_observe::admin_get_as(
            &record.admin,
            "/players",
            Duration::from_secs(2),
            token,
        )
        .await
        else {
            continue;
        };
        let Ok(listed) = serde_json::from_str::<ShardPlayers>(&body) else { continue };
        if let Some(p) = listed.players.iter().find(|p| p.id == player) {
            return Some((*shard, p.x, p.y));
        }
    }
    None
}

/// Polls the shards until `done` holds for where `player` is listed.
async fn wait_for(
    view: &ClusterView,
    player: u64,
    token: Option<&str>,
    done: impl Fn(Option<(ShardId, u32, u32)>) -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if done(where_online(view, player, token).await) {
            return Ok(());
        }
        if started.elapsed() > WAIT_FOR_ORDER {
            bail!("not carried out within {WAIT_FOR_ORDER:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
