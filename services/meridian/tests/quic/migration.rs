//! Connection migration: a QUIC client moves to a new UDP socket mid-session and keeps its
//! session, its player and its acks; observers see its moves go on and no Left.

use std::time::{Duration, Instant};

use anyhow::ensure;
use meridian_testkit::pb::Direction;
use meridian_testkit::{metric_total, Bot, ClusterOptions, Io};

use crate::mixed::move_expecting;
use crate::{entered, seen_moving, with_cluster};

#[test]
fn a_rebound_client_keeps_its_session() {
    with_cluster(ClusterOptions::new(Io::Uring), |cluster| {
        let quic = cluster.quic_target(0);
        let mut tcp_observer = Bot::connect(cluster.game_addr(0))?;
        tcp_observer.login("tcp-observer", Some((100, 110)))?;
        let mut quic_observer = Bot::connect(quic)?;
        quic_observer.login("quic-observer", Some((110, 100)))?;
        tcp_observer.check_streams();
        quic_observer.check_streams();
        let mut roamer = Bot::connect(quic)?;
        roamer.check_streams();
        let login = roamer.login("roamer", Some((100, 100)))?;
        let id = roamer.id();
        ensure!(login.after.len() == 2, "roamer sees both observers: {login:?}");
        tcp_observer
            .expect_messages(&[entered(&quic_observer, 110, 100), entered(&roamer, 100, 100)])?;
        quic_observer.expect_messages(&[entered(&roamer, 100, 100)])?;

        let mut x = 100;
        let mut client_time = 0;
        let mut step = |roamer: &mut Bot, observers: [&mut Bot; 2]| -> anyhow::Result<Duration> {
            client_time += 1;
            let direction = if client_time % 2 == 1 { Direction::Right } else { Direction::Left };
            x = if direction == Direction::Right { x + 1 } else { x - 1 };
            let sent = Instant::now();
            move_expecting(roamer, direction, client_time, (x, 100), &[])?;
            let took = sent.elapsed();
            for observer in observers {
                observer.expect_messages(&[seen_moving(roamer, x, 100)])?;
            }
            Ok(took)
        };
        for _ in 0..3 {
            step(&mut roamer, [&mut tcp_observer, &mut quic_observer])?;
        }
        let mut before = Vec::new();
        for _ in 0..3 {
            before.push(step(&mut roamer, [&mut tcp_observer, &mut quic_observer])?);
        }

        for round in 1..=2 {
            let old = roamer.local_addr()?;
            let new = roamer.rebind()?;
            ensure!(old != new, "rebinding moved the client from {old} to {new}");
            // The first move after the rebind is the first packet from the new address.
            let gap = step(&mut roamer, [&mut tcp_observer, &mut quic_observer])?;
            let mut after = Vec::new();
            for _ in 0..3 {
                after.push(step(&mut roamer, [&mut tcp_observer, &mut quic_observer])?);
            }
            eprintln!(
                "migration {round}: {old} -> {new}; first ack after rebind {gap:?}, \
                 acks before {before:?}, after {after:?}"
            );
            ensure!(roamer.id() == id, "same player after migration");
        }
        // Nobody saw the roamer leave: every observer message was checked above, and the
        // stream checkers saw no Left for a player in sight.
        tcp_observer.expect_messages(&[])?;
        quic_observer.expect_messages(&[])?;
        let admin = cluster.gateway(0).admin;
        let migrations = metric_total(admin, "meridian_gateway_quic_migrations_total")?;
        ensure!(migrations >= 2.0, "the gateway counted {migrations} migrations, expected 2");
        Ok(())
    })
}
