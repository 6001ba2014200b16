//! Clients that fail the handshake (a wrong ALPN, a certificate they do not trust) or send
//! garbage datagrams are refused, and players already in the world notice nothing.

use std::net::UdpSocket;

use anyhow::ensure;
use meridian_testkit::quic::QuicOptions;
use meridian_testkit::{
    deadline, metric_total, wait_until, Bot, Bystander, ClusterOptions, Io, QuicClient,
    DEFAULT_WAIT,
};

use crate::{with_cluster, BYSTANDER_HOME};

#[test]
fn bad_handshakes_are_refused_without_disturbing_anyone() {
    with_cluster(ClusterOptions::new(Io::Uring), |cluster| {
        let quic = cluster.quic_target(0);
        let over_quic = Bystander::start(quic, "quic-bystander", BYSTANDER_HOME)?;
        let over_tcp = Bystander::start(cluster.game_addr(0), "tcp-bystander", (100, 300))?;
        over_quic.wait_for_acks(3)?;
        over_tcp.wait_for_acks(3)?;

        let wrong_alpn = QuicOptions { alpn: vec![b"meridian/0".to_vec()], ..Default::default() };
        let refused = QuicClient::connect_with(&quic, &wrong_alpn);
        ensure!(refused.is_err(), "a client offering ALPN meridian/0 was let in");
        let no_alpn = QuicOptions { alpn: Vec::new(), ..Default::default() };
        let refused = QuicClient::connect_with(&quic, &no_alpn);
        ensure!(refused.is_err(), "a client offering no ALPN was let in");
        // The client does not trust the certificate for this name: it aborts the handshake.
        let wrong_name =
            QuicOptions { server_name: "not-the-gateway.example".into(), ..Default::default() };
        let refused = QuicClient::connect_with(&quic, &wrong_name);
        ensure!(refused.is_err(), "a client verifying another name completed a handshake");
        // Garbage datagrams, a truncated Initial-looking one included.
        let garbage = UdpSocket::bind("127.0.0.1:0")?;
        for len in [1, 20, 1200, 1500] {
            let mut datagram = vec![0xc3u8; len];
            datagram.iter_mut().enumerate().for_each(|(i, b)| *b ^= i as u8);
            garbage.send_to(&datagram, quic.addr)?;
        }

        let admin = cluster.gateway(0).admin;
        wait_until(deadline(DEFAULT_WAIT), "3 handshake failures counted", || {
            metric_total(admin, "meridian_gateway_quic_handshake_failures_total")
                .is_ok_and(|n| n >= 3.0)
        })?;
        // The players kept playing throughout, and a good client still gets in.
        over_quic.wait_for_acks(3)?;
        over_tcp.wait_for_acks(3)?;
        let mut late = Bot::connect(quic)?;
        let login = late.login("late", Some((50, 50)))?;
        ensure!(login.after.is_empty(), "late is alone: {login:?}");
        ensure!(late.quic_handshake().is_some(), "late is a QUIC bot");
        eprintln!("handshake of a good client: {:?}", late.quic_handshake());
        over_quic.finish()?;
        over_tcp.finish()?;
        Ok(())
    })
}
