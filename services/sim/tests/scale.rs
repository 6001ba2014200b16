//! The scale model on a small cluster (16 shards, 4,000 walkers on a 1,000 x 1,000 map):
//! its counts are consistent with each other, grow with sight as they must, and stay
//! within a factor of what border length, sight and density predict.

use std::time::Duration;

use meridian_sim::scale::{self, PeerKind, ScaleConfig, ScaleReport};

fn small(view_range: u32) -> ScaleConfig {
    ScaleConfig {
        map: 1_000,
        warmup: Duration::from_secs(2),
        measure: Duration::from_secs(5),
        seed: 7,
        ..ScaleConfig::new(16, 4_000, view_range)
    }
}

/// Measured over predicted, with what was compared, for a failure message.
fn within(what: &str, measured: f64, predicted: f64, factor: f64) {
    let ratio = measured / predicted;
    assert!(
        (1.0 / factor..=factor).contains(&ratio),
        "{what}: measured {measured:.4}, predicted {predicted:.4} (ratio {ratio:.2}, allowed 1/{factor}..{factor})"
    );
}

fn check_consistent(report: &ScaleReport) {
    let c = &report.config;
    let at = format!("{} shards, {} players, sight {}", c.shards, c.players, c.view_range);
    assert_eq!(report.placed, u64::from(c.players), "{at}: every player is local on some shard");
    assert!(report.moves_sent > 0, "{at}: players moved");
    assert_eq!(report.move_answers, report.moves_sent, "{at}: every move is answered");
    let handoffs = report.count(PeerKind::Handoff).messages;
    assert!(handoffs > 0, "{at}: walkers crossed borders");
    assert_eq!(
        report.count(PeerKind::HandoffAck).messages,
        handoffs,
        "{at}: every handoff is confirmed (delivery is immediate)"
    );
    let released = report.count(PeerKind::Released).messages;
    assert!(
        (handoffs..=handoffs * u64::from(c.shards - 2)).contains(&released),
        "{at}: {released} Released for {handoffs} handoffs: at least one each, at most one per other shard"
    );
    let total = report.per_player(report.total().messages);
    assert!(total > 0.0, "{at}: shards talk to each other");
    let p = scale::predict(c);
    within(&format!("{at}: peer msgs per player per second"), total, p.total_per_player, 1.5);
    within(&format!("{at}: ghosts per shard"), report.ghosts_mean, p.ghosts_per_shard, 1.5);
    within(
        &format!("{at}: handoffs per shard per second"),
        report.handoffs_per_shard(),
        p.handoffs_per_shard,
        1.5,
    );
}

#[test]
fn counts_are_consistent_and_grow_with_sight() {
    let reports: Vec<ScaleReport> =
        [5, 10, 20].into_iter().map(|sight| scale::run(&small(sight))).collect();
    for report in &reports {
        check_consistent(report);
    }
    for pair in reports.windows(2) {
        let (narrow, wide) = (&pair[0], &pair[1]);
        let sights = (narrow.config.view_range, wide.config.view_range);
        assert!(
            wide.ghosts_mean > narrow.ghosts_mean * 1.5,
            "ghosts per shard should grow with sight {sights:?}: {:.1} then {:.1}",
            narrow.ghosts_mean,
            wide.ghosts_mean
        );
        let moved = |r: &ScaleReport| r.count(PeerKind::Moved).messages;
        assert!(
            moved(wide) > moved(narrow),
            "ghost updates should grow with sight {sights:?}: {} then {}",
            moved(narrow),
            moved(wide)
        );
    }
    let table = scale::markdown(&reports);
    // Shown with --nocapture.
    println!("{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| 16 |")).count(),
        6,
        "two rows per run:\n{table}"
    );
}

#[test]
fn a_seed_gives_the_same_counts() {
    let config = ScaleConfig { measure: Duration::from_secs(2), players: 1_000, ..small(5) };
    let (a, b) = (scale::run(&config), scale::run(&config));
    let counts = |r: &ScaleReport| PeerKind::ALL.map(|k| r.count(k).messages);
    assert_eq!(counts(&a), counts(&b), "seed {}", config.seed);
    assert_eq!(a.ghosts_mean, b.ghosts_mean, "seed {}", config.seed);
}
