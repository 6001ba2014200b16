//! A port another cluster serves is refused at start, naming the port and the flag (issue
//! 32): the gateway binds with SO_REUSEPORT, which would otherwise let a second cluster
//! share the port and split the players between two worlds.

use std::net::SocketAddr;

use anyhow::{ensure, Context};
use meridian_testkit::{Cluster, ClusterOptions, CommandRun, Io};

use crate::meridian_bin;

/// A `meridian gateway` of another cluster (its etcd is nowhere: it must fail before it
/// looks) on the given addresses.
fn second_gateway(
    cluster: &Cluster,
    listen: SocketAddr,
    ws: SocketAddr,
    quic: SocketAddr,
) -> anyhow::Result<CommandRun> {
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (listen, ws, quic) = (listen.to_string(), ws.to_string(), quic.to_string());
    let etcd = format!("http://{nowhere}");
    cluster.run_meridian(&[
        "gateway",
        "--id",
        "9",
        "--dev",
        "--cluster",
        "another",
        "--etcd",
        &etcd,
        "--admin",
        "127.0.0.1:0",
        "--listen",
        &listen,
        "--ws",
        &ws,
        "--quic",
        &quic,
    ])
}

fn refused(run: &CommandRun, port: u16, flag: &str) -> anyhow::Result<()> {
    ensure!(!run.status.success(), "a taken port must fail the start: {run:?}");
    let port = format!("port {port}");
    ensure!(run.stderr.contains(&port), "the message names the {port}: {run:?}");
    ensure!(run.stderr.contains(flag), "the message names {flag}: {run:?}");
    ensure!(run.stderr.contains("is taken"), "the message says it is taken: {run:?}");
    // stderr is a file here: the log lines before the error carry no colour codes.
    ensure!(!run.stderr.contains('\x1b'), "no ANSI escape in a log written to a file: {run:?}");
    ensure!(
        run.stderr.matches("in use").count() <= 1,
        "the cause is said once, not repeated: {run:?}"
    );
    Ok(())
}

#[test]
fn a_port_another_cluster_serves_is_refused_naming_port_and_flag() {
    // Two workers: the first cluster's ports each hold an SO_REUSEPORT group of two.
    let opts = ClusterOptions::new(Io::Epoll).env("MERIDIAN_WORKERS", "2");
    let cluster = Cluster::start(meridian_bin(), opts).expect("meridian up");
    let checked = (|| {
        let gateway = cluster.gateway(0).clone();
        let ws = gateway.ws.context("the gateway serves WebSocket")?;
        let quic = gateway.quic.context("the gateway serves QUIC")?;
        let any: SocketAddr = "127.0.0.1:0".parse()?;

        // `meridian up` on the same ports: refused before it starts anything.
        let run = cluster.run_meridian(&[
            "up",
            "--port",
            &gateway.game.port().to_string(),
            "--ws-port",
            &ws.port().to_string(),
            "--quic-port",
            &quic.port().to_string(),
            "--etcd-port",
            "0",
        ])?;
        refused(&run, gateway.game.port(), "--port")?;
        refused(&run, ws.port(), "--ws-port")?;
        refused(&run, quic.port(), "--quic-port")?;
        ensure!(!run.stdout.contains("is ready"), "nothing started: {run:?}");

        // A gateway on each taken port in turn.
        let run = second_gateway(&cluster, gateway.game, any, any)?;
        refused(&run, gateway.game.port(), "--listen")?;
        let run = second_gateway(&cluster, any, ws, any)?;
        refused(&run, ws.port(), "--ws")?;
        let run = second_gateway(&cluster, any, any, quic)?;
        refused(&run, quic.port(), "--quic")?;

        // The wildcard address overlaps the first cluster's loopback one.
        let wildcard: SocketAddr = format!("0.0.0.0:{}", gateway.game.port()).parse()?;
        let run = second_gateway(&cluster, wildcard, any, any)?;
        refused(&run, gateway.game.port(), "--listen")?;
        Ok(())
    })();
    if let Err(error) = checked {
        panic!("{error:#}\n{}", cluster.log_tail());
    }
    cluster.stop().expect("the first cluster stops cleanly");
}
