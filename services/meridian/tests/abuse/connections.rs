//! Scenario 4: connection floods past the gateway's caps. Connections from one address
//! past `--max-connections-per-address` or faster than `--connect-rate`, and any past
//! `--max-connections`, are told why (`UNAVAILABLE` with a detail) and closed; other
//! addresses and the players already in are not affected, and a closed connection frees
//! its place.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::ensure;
use meridian_testkit::abuse::{metric_value, Admitted, RawClient, RawOptions};
use meridian_testkit::{deadline, wait_until, Bystander, ClusterOptions, Front, DEFAULT_WAIT};

use crate::{with_cluster, BYSTANDER_HOME};

const PER_ADDRESS: &str = "too many connections from your address";
const TOO_FAST: &str = "too many connections from your address per second";
const FULL: &str = "server full";

fn refused_total(admin: std::net::SocketAddr, reason: &str) -> anyhow::Result<f64> {
    metric_value(admin, "meridian_gateway_connections_refused_total", &[("reason", reason)])
}

/// Waits until the gateway counts `open` client connections.
fn wait_open(admin: std::net::SocketAddr, open: f64) -> anyhow::Result<()> {
    wait_until(deadline(DEFAULT_WAIT), &format!("the gateway to count {open} connections"), || {
        metric_value(admin, "meridian_gateway_connections", &[]).is_ok_and(|n| n == open)
    })
}

pub fn connections_per_address(front: Front) {
    let opts = ClusterOptions::new(front)
        .arg("--limit-exempt")
        .arg("")
        .env("MERIDIAN_MAX_CONNECTIONS_PER_ADDRESS", "20")
        .env("MERIDIAN_CONNECT_RATE", "1000");
    with_cluster(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        // The bystander comes from 127.0.0.1 too and holds one of its 20 places.
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let refused_before = refused_total(admin, "per_address")?;
        let mut open = Vec::new();
        for n in 2..=31 {
            let mut client = RawClient::connect(addr)?;
            let admitted = client.admitted()?;
            if n <= 20 {
                ensure!(admitted == Admitted::Yes, "connection {n} from 127.0.0.1: {admitted:?}");
                open.push(client);
            } else {
                ensure!(
                    admitted == Admitted::Refused(PER_ADDRESS.into()),
                    "connection {n} from 127.0.0.1, past 20: {admitted:?}"
                );
            }
        }
        let refused = refused_total(admin, "per_address")? - refused_before;
        ensure!(
            refused == 11.0,
            "connections_refused_total{{reason=\"per_address\"}} moved by {refused}, expected 11"
        );

        // Another address is not affected.
        let other = RawOptions {
            local_ip: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            ..Default::default()
        };
        let mut elsewhere = RawClient::connect_with(addr, other)?;
        let (_, seen) = elsewhere.login("elsewhere", Some((100, 100)))?;
        ensure!(seen.is_empty(), "nobody near (100, 100): {seen:?}");

        // Closing the 19 frees their places.
        for client in open.drain(..) {
            client.close();
        }
        wait_open(admin, 2.0)?;
        let mut again = RawClient::connect(addr)?;
        ensure!(again.admitted()? == Admitted::Yes, "a connection from 127.0.0.1 after closing 19");
        ensure!(elsewhere.ping_barrier()?.is_empty(), "the player from 127.0.0.2 still plays");
        bystander.finish()?;
        Ok(())
    })
}

pub fn connection_rate_per_address(front: Front) {
    let opts =
        ClusterOptions::new(front).arg("--limit-exempt").arg("").env("MERIDIAN_CONNECT_RATE", "2");
    with_cluster(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let refused_before = refused_total(admin, "address_rate")?;
        // The bystander's connection takes one of the burst of 10.
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let started = std::time::Instant::now();
        let mut clients =
            (0..15).map(|_| RawClient::connect(addr)).collect::<anyhow::Result<Vec<_>>>()?;
        let mut admitted = 0;
        let mut refused = 0;
        for (i, client) in clients.iter_mut().enumerate() {
            match client.admitted()? {
                Admitted::Yes => admitted += 1,
                Admitted::Refused(detail) => {
                    ensure!(detail == TOO_FAST, "connection {i} of 15 refused with {detail:?}");
                    refused += 1;
                }
            }
        }
        // Nine left of the burst, plus what 2/s refilled since the bystander connected.
        let refill = (2.0 * started.elapsed().as_secs_f64()).ceil() as usize + 1;
        eprintln!("connect rate ({front:?}): of 15 at once {admitted} admitted, {refused} refused");
        ensure!(
            (9..=9 + refill).contains(&admitted),
            "{admitted} of 15 connections admitted at once; the burst leaves 9 (+{refill} refilled)"
        );
        let counted = refused_total(admin, "address_rate")? - refused_before;
        ensure!(
            counted == refused as f64,
            "address_rate counted {counted}, {refused} were refused"
        );

        // The rate refills (2/s): a connection is taken again (a refused try takes nothing).
        let mut later = None;
        wait_until(deadline(DEFAULT_WAIT), "a connection admitted after the refill", || {
            match RawClient::connect(addr).and_then(|mut c| Ok((c.admitted()?, c))) {
                Ok((Admitted::Yes, client)) => {
                    later = Some(client);
                    true
                }
                _ => false,
            }
        })?;
        bystander.finish()?;
        Ok(())
    })
}

pub fn gateway_connection_cap(front: Front) {
    let opts = ClusterOptions::new(front).env("MERIDIAN_MAX_CONNECTIONS", "10");
    with_cluster(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let refused_before = refused_total(admin, "full")?;
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut open = Vec::new();
        for n in 2..=10 {
            let mut client = RawClient::connect(addr)?;
            ensure!(client.admitted()? == Admitted::Yes, "connection {n} of the 10 allowed");
            open.push(client);
        }
        let mut eleventh = RawClient::connect(addr)?;
        let answer = eleventh.admitted()?;
        ensure!(answer == Admitted::Refused(FULL.into()), "the 11th connection: {answer:?}");
        let counted = refused_total(admin, "full")? - refused_before;
        ensure!(counted == 1.0, "connections_refused_total{{reason=\"full\"}} moved by {counted}");
        open.pop().expect("invariant: nine are open").close();
        wait_open(admin, 9.0)?;
        let mut next = RawClient::connect(addr)?;
        ensure!(next.admitted()? == Admitted::Yes, "a connection once one of the 10 closed");
        bystander.finish()?;
        Ok(())
    })
}
