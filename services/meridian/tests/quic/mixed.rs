//! TCP and QUIC players in one area see each other exactly as the world rules say.

use anyhow::{ensure, Context};
use meridian_testkit::pb::{Direction, ServerMessage};
use meridian_testkit::{Bot, ClusterOptions, Io};

use crate::{chat_from, entered, left, seen_moving, with_cluster};

/// Moves `bot` and checks it gets its ack at `to` and, besides, exactly `others` (any
/// order, before or after the ack).
pub fn move_expecting(
    bot: &mut Bot,
    direction: Direction,
    client_time: u64,
    to: (u32, u32),
    others: &[ServerMessage],
) -> anyhow::Result<()> {
    let answer = bot.move_(direction, client_time)?;
    let at = answer.ack().with_context(|| format!("{} moving {direction:?}", bot.label()))?;
    ensure!(at == to, "{} acked at {at:?}, expected {to:?}", bot.label());
    let mut rest = others.to_vec();
    for message in &answer.others {
        let i = rest
            .iter()
            .position(|m| m == message)
            .with_context(|| format!("{} got unexpected {message:?} with its move", bot.label()))?;
        rest.remove(i);
    }
    bot.expect_messages(&rest)
}

#[test]
fn tcp_and_quic_players_share_one_world() {
    // One shard, so every notification is in order with the ping barriers that delimit
    // each check (cross-shard ones may trail a barrier); the mixed walk covers 4 shards.
    with_cluster(ClusterOptions::new(Io::Uring), |cluster| {
        let (tcp, quic) = (cluster.game_addr(0), cluster.quic_target(0));
        let status = cluster.status_json()?;
        let published = &status["gateways"][0]["quic"];
        ensure!(*published == quic.addr.to_string(), "etcd publishes the QUIC front: {status}");
        let mut tina = Bot::connect(tcp)?;
        tina.login("tina", Some((190, 100)))?;
        let mut quinn = Bot::connect(quic)?;
        ensure!(quinn.is_quic() && !tina.is_quic(), "one bot per transport");
        let login = quinn.login("quinn", Some((205, 100)))?;
        ensure!(login.entered_ids() == [tina.id()].into(), "quinn sees tina: {login:?}");
        let mut tom = Bot::connect(tcp)?;
        let login = tom.login("tom", Some((215, 110)))?;
        ensure!(login.entered_ids() == [quinn.id()].into(), "tom sees quinn only: {login:?}");
        let mut queenie = Bot::connect(quic)?;
        let login = queenie.login("queenie", Some((211, 100)))?;
        ensure!(login.entered_ids() == [quinn.id(), tom.id()].into(), "queenie: {login:?}");
        tina.expect_messages(&[entered(&quinn, 205, 100)])?;
        quinn.expect_messages(&[entered(&tom, 215, 110), entered(&queenie, 211, 100)])?;
        tom.expect_messages(&[entered(&queenie, 211, 100)])?;

        // A QUIC move is seen by TCP and QUIC observers alike.
        move_expecting(&mut quinn, Direction::Right, 1, (206, 100), &[])?;
        tina.expect_messages(&[seen_moving(&quinn, 206, 100)])?;
        tom.expect_messages(&[seen_moving(&quinn, 206, 100)])?;
        queenie.expect_messages(&[seen_moving(&quinn, 206, 100)])?;

        // A TCP move brings tina (191) and queenie (211) into each other's sight.
        let queenie_seen = entered(&queenie, 211, 100);
        move_expecting(&mut tina, Direction::Right, 1, (191, 100), &[queenie_seen])?;
        queenie.expect_messages(&[entered(&tina, 191, 100)])?;
        quinn.expect_messages(&[seen_moving(&tina, 191, 100)])?;
        tom.expect_messages(&[])?;

        // A QUIC move takes queenie (212) out of tina's sight again.
        move_expecting(&mut queenie, Direction::Right, 1, (212, 100), &[left(&tina)])?;
        tina.expect_messages(&[left(&queenie)])?;
        quinn.expect_messages(&[seen_moving(&queenie, 212, 100)])?;
        tom.expect_messages(&[seen_moving(&queenie, 212, 100)])?;

        // Chat reaches the speaker and everyone who sees it, whatever their transport.
        tom.chat("from tcp")?;
        let heard = chat_from(&tom, "from tcp");
        for bot in [&mut tom, &mut quinn, &mut queenie] {
            bot.expect_messages(std::slice::from_ref(&heard))?;
        }
        quinn.chat("from quic")?;
        let heard = chat_from(&quinn, "from quic");
        for bot in [&mut quinn, &mut tina, &mut tom, &mut queenie] {
            bot.expect_messages(std::slice::from_ref(&heard))?;
        }
        tina.expect_messages(&[])?;

        // An abrupt QUIC disconnect: Left for TCP and QUIC observers.
        let queenie_left = left(&queenie);
        queenie.reset()?;
        quinn.expect_messages(std::slice::from_ref(&queenie_left))?;
        tom.expect_messages(&[queenie_left])?;
        tina.expect_messages(&[])?;
        Ok(())
    })
}
