//! Picking a loopback port for a server started later (etcd by `meridian up`, PostgreSQL
//! and etcd in the tests), which takes no inherited listener.

use std::net::TcpListener;

/// The lowest port [`listen_port`] picks from.
const PICKED_PORTS_FROM: u16 = 10_000;

/// A loopback port nobody listens on now, for a server that binds it itself. It is picked
/// below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`) when there is room:
/// a port of that range can be taken by any outgoing connection before the server binds
/// it, or while it is stopped (CI: etcd started again could not listen on its peer port,
/// and a test's PostgreSQL could not bind the port just released to it).
pub fn listen_port() -> std::io::Result<u16> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if let Some(span) = ephemeral_from.checked_sub(PICKED_PORTS_FROM).filter(|s| *s >= 1_000) {
        // A random start (std's hasher keys are random), then the next ports in turn.
        use std::hash::{BuildHasher, RandomState};
        let start = RandomState::new().hash_one(std::process::id()) % u64::from(span);
        for i in 0..200u64 {
            let port = PICKED_PORTS_FROM + ((start + i) % u64::from(span)) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_port_is_free_and_below_the_ephemeral_range() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("Linux says its ephemeral range");
        let from: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        let port = listen_port().expect("a port");
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok(), "port {port} is free");
        if from >= PICKED_PORTS_FROM + 1_000 {
            assert!((PICKED_PORTS_FROM..from).contains(&port), "{port} not below {from}");
        }
    }
}
