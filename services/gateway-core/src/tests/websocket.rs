//! The WebSocket path through the door: every frame a client sends, fragments and control
//! frames included, is paid for from the connection's input budget before it is read; past
//! the budget reading pauses, and input that keeps coming while paused is cut off past
//! [`INBUF_LIMIT`], as over TCP (issue 31).

use super::*;

const FIN: u8 = 0x80;
const CONTINUATION: u8 = 0x0;
const BINARY: u8 = 0x2;
const PING: u8 = 0x9;
const PONG: u8 = 0xa;
/// A masked client frame's header with a payload under 126 bytes.
const SMALL_HEADER: usize = 6;

fn upgrade_request() -> Vec<u8> {
    b"GET /play HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
      Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .to_vec()
}

/// A client frame (`first` is the FIN bit and the opcode), masked as clients must.
fn client_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    assert!(payload.len() < 126, "small frames only");
    let mut frame = vec![first, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

fn ping_body(client_time: u64) -> Vec<u8> {
    use prost::Message as _;
    let ping = C::Ping(meridian_protocol::pb::Ping { client_time });
    ClientMessage { kind: Some(ping) }.encode_to_vec()
}

/// A WebSocket client connected and upgraded at `now`; its slot.
fn ws_connect(core: &mut TestCore, now: Instant) -> u32 {
    let endpoint = core.core.accept(now, None, Front::WebSocket).expect("admitted");
    let slot = endpoint.index();
    core.on_data(slot, &upgrade_request(), now);
    let out = core.get_mut(slot).map(|c| std::mem::take(&mut c.out)).unwrap_or_default();
    assert!(out.starts_with(b"HTTP/1.1 101 "), "{}", String::from_utf8_lossy(&out));
    slot
}

/// The server frames written to the connection since the last call: opcode and payload.
fn written(core: &mut TestCore, slot: u32) -> Vec<(u8, Vec<u8>)> {
    let out = core.get_mut(slot).map(|c| std::mem::take(&mut c.out)).unwrap_or_default();
    let mut frames = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let opcode = out[at] & 0x0f;
        let (len, size) = match out[at + 1] {
            126 => (usize::from(u16::from_be_bytes([out[at + 2], out[at + 3]])), 4),
            127 => panic!("no server frame here is that long"),
            short => (usize::from(short), 2),
        };
        frames.push((opcode, out[at + size..at + size + len].to_vec()));
        at += size + len;
    }
    frames
}

fn count(frames: &[(u8, Vec<u8>)], opcode: u8) -> usize {
    frames.iter().filter(|(op, _)| *op == opcode).count()
}

/// The protocol messages among `frames` (the binary ones).
fn messages(frames: &[(u8, Vec<u8>)]) -> Vec<ServerMessage> {
    use prost::Message as _;
    frames
        .iter()
        .filter(|(op, _)| *op == BINARY)
        .map(|(_, body)| ServerMessage::decode(body.as_slice()).expect("a server message"))
        .collect()
}

fn waiting(core: &mut TestCore, slot: u32) -> usize {
    let conn = core.get_mut(slot).expect("a connection in the slot");
    conn.inbuf.len() + conn.ws.as_ref().map_or(0, |ws| ws.held())
}

#[test]
fn websocket_pings_spend_the_input_budget_pause_reading_and_are_cut_if_they_keep_coming() {
    let (mut core, _links, _mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = ws_connect(&mut core, t0);
    let pings: Vec<u8> =
        (0..1000u64).flat_map(|t| client_frame(FIN | PING, &t.to_be_bytes())).collect();
    core.on_data(slot, &pings, t0);
    assert_eq!(count(&written(&mut core, slot), PONG), 200, "the frame burst, then reading pauses");
    assert!(core.get_mut(slot).unwrap().read_paused);
    assert_eq!(waiting(&mut core, slot), 800 * (SMALL_HEADER + 8), "the rest waits unread");
    // A second later the budget has 100 more frames.
    tick(&mut core, t0 + Duration::from_secs(1));
    assert_eq!(count(&written(&mut core, slot), PONG), 100);
    assert!(core.get_mut(slot).unwrap().read_paused, "still 700 waiting");
    // Pings that keep arriving while paused are not answered, and past the bound the client
    // is cut off.
    let flood: Vec<u8> = (0..INBUF_LIMIT / (SMALL_HEADER + 8))
        .flat_map(|t| client_frame(FIN | PING, &(t as u64).to_be_bytes()))
        .collect();
    core.on_data(slot, &flood, t0 + Duration::from_secs(1));
    assert_eq!(core.get_mut(slot).map(|c| c.closing), Some(Closing::AfterFlush));
    let told = written(&mut core, slot);
    assert_eq!(count(&told, PONG), 0);
    assert_eq!(errors(&messages(&told)), vec![(ErrorCode::RateLimited, 0)]);
    assert_eq!(waiting(&mut core, slot), 0, "nothing is kept of a cut client's input");
}

#[test]
fn websocket_fragments_spend_the_input_budget_and_the_message_arrives_once_paid_for() {
    let (mut core, _links, _mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = ws_connect(&mut core, t0);
    // One message in 400 frames: an empty first fragment, 398 empty continuations, and a
    // last one carrying a Ping.
    let mut message = client_frame(BINARY, &[]);
    for _ in 0..398 {
        message.extend(client_frame(CONTINUATION, &[]));
    }
    message.extend(client_frame(FIN | CONTINUATION, &ping_body(7)));
    core.on_data(slot, &message, t0);
    assert!(core.get_mut(slot).unwrap().read_paused, "200 fragments, then reading pauses");
    assert!(written(&mut core, slot).is_empty());
    tick(&mut core, t0 + Duration::from_secs(1));
    assert!(core.get_mut(slot).unwrap().read_paused, "300 read, 100 to go");
    assert!(written(&mut core, slot).is_empty());
    // The last 100 frames are paid for two seconds in: the message is whole, and costs
    // nothing more than the frames it came in.
    tick(&mut core, t0 + Duration::from_secs(2));
    assert_eq!(messages(&written(&mut core, slot)), vec![server::pong(7)]);
    assert_eq!(waiting(&mut core, slot), 0);

    // Fragments that keep coming with the budget spent wait, up to the bound; past it the
    // client is cut off.
    let mut flood = client_frame(BINARY, &[]);
    for _ in 0..INBUF_LIMIT / SMALL_HEADER {
        flood.extend(client_frame(CONTINUATION, &[]));
    }
    core.on_data(slot, &flood, t0 + Duration::from_secs(2));
    assert_eq!(core.get_mut(slot).map(|c| c.closing), Some(Closing::AfterFlush));
    assert_eq!(errors(&messages(&written(&mut core, slot))), vec![(ErrorCode::RateLimited, 0)]);
    assert_eq!(waiting(&mut core, slot), 0, "nothing is kept of a cut client's input");
}

#[test]
fn a_websocket_message_in_one_frame_costs_one_frame_as_over_tcp() {
    let (mut core, _links, _mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = ws_connect(&mut core, t0);
    let pings: Vec<u8> =
        (1..=300u64).flat_map(|t| client_frame(FIN | BINARY, &ping_body(t))).collect();
    core.on_data(slot, &pings, t0);
    let pongs = messages(&written(&mut core, slot));
    assert_eq!(pongs.len(), 200, "the frame burst");
    assert_eq!(pongs[199], server::pong(200), "in order");
    assert!(core.get_mut(slot).unwrap().read_paused);
    tick(&mut core, t0 + Duration::from_secs(1));
    assert_eq!(messages(&written(&mut core, slot)).first(), Some(&server::pong(201)));
}
