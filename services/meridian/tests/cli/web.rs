//! `meridian status --web` serves the live map, which names players: open on a loopback
//! address, and only behind the admin token anywhere else.

use crate::meridian_bin;

#[test]
fn the_live_map_off_loopback_needs_the_admin_token() {
    let output = std::process::Command::new(meridian_bin())
        .args(["status", "--web", "0.0.0.0:0", "--etcd", "http://127.0.0.1:9"])
        .env_remove("MERIDIAN_ADMIN_TOKEN")
        .output()
        .expect("meridian runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "served without a token: {stderr}");
    assert!(stderr.contains("needs --admin-token"), "{stderr}");
}
