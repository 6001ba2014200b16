//! WebSocket (RFC 6455) on the gateway's own event loops, sans-IO.
//!
//! A WebSocket session is a TCP connection of an io_uring or epoll worker like any other;
//! only its bytes differ. [`WsState`] turns what the socket read into the length-delimited
//! frames the core reads from TCP (a varint prefix and the body: framing limits, error
//! codes, budgets, routing and the relay are the very same code), and the core writes its
//! output as WebSocket frames ([`write_frames`], [`write_message`]) where it would write
//! prefixed ones: one binary WebSocket message per protobuf body, no prefix (DESIGN.md
//! section 2b). Each message is copied once on its way in (unmasked into the core's frames)
//! and once on its way out (into the connection's output buffer), as over TCP.
//!
//! - The upgrade: a `GET` with `Upgrade: websocket`, `Connection: upgrade`,
//!   `Sec-WebSocket-Version: 13` and a key; any path; the subprotocol `meridian.v1` is
//!   agreed to when offered; no extension is. At most [`MAX_REQUEST`] bytes, within the
//!   login deadline. Anything else gets an HTTP error (400, 426 or 431) and the close.
//! - A text message is no protocol message: it reaches the core as an undecodable body
//!   (`MALFORMED`, then the close). A message larger than the frame limit reaches it as a
//!   prefix announcing its length (`FRAME_TOO_LARGE`, then the close), as soon as the frame
//!   header shows it; nothing of it is kept.
//! - A broken frame (unmasked, reserved bits, an unknown opcode, a control frame that is
//!   fragmented or longer than 125 bytes, a continuation of nothing) is `MALFORMED`, then
//!   the close.
//! - Every frame the client sends (a whole message, each fragment of a fragmented one, a
//!   ping, a pong, the close) is paid for before it is read: [`WsState::read`] asks `pay`
//!   for the frame's size on the wire, and a frame `pay` refuses waits unread, with
//!   everything behind it ([`Read::waiting`]), until the caller reads again with its budget
//!   refilled. Nothing is unmasked, assembled or answered before it is paid for, so a
//!   flood of empty fragments or of pings spends the budget like one of messages.
//! - Pings are answered with pongs. The client's close is answered with a close and ends
//!   the session (the player leaves, as when a TCP client hangs up); the answer echoes the
//!   client's code if it is one a peer may send (RFC 6455 section 7.4: 1000-1003,
//!   1007-1014, 3000-4999), carries 1002 (protocol error) for any other code or a one-byte
//!   body, 1007 for a reason that is not UTF-8, and no code when the client gave none.
//! - The gateway's own close carries [`WsState::close_code`]: 1002 after a broken frame, 1003
//!   after a text message, 1009 after a message over the frame limit, else 1000.
//! - Behind a TLS-terminating ingress (`wss://`), the ingress speaks TLS and this code
//!   plain WebSocket.

use base64::Engine;
use prost::Message;

/// The subprotocol agreed to when a client offers it.
pub const SUBPROTOCOL: &str = "meridian.v1";
/// The upgrade request (request line and headers) at most, in bytes.
pub const MAX_REQUEST: usize = 8 * 1024;
/// Headers read at most in the upgrade request.
const MAX_HEADERS: usize = 32;
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xa;
const FIN: u8 = 0x80;
/// Close codes: normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close codes: the peer broke the protocol (here: a close code no peer may send).
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// Close codes: data that does not fit its type (here: a close reason that is not UTF-8).
pub const CLOSE_INVALID_DATA: u16 = 1007;
/// Close code: the endpoint got data of a type it cannot accept (a text message).
pub const CLOSE_UNSUPPORTED_DATA: u16 = 1003;
/// Close code: a message too big to process (over the frame limit).
pub const CLOSE_TOO_BIG: u16 = 1009;

/// What a text message or a broken frame becomes for the core: a frame whose one-byte
/// body (`0xff`, a field of the reserved wire type 7) no protobuf decoder takes, so it is
/// refused `MALFORMED`.
pub const UNDECODABLE: [u8; 2] = [1, 0xff];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the HTTP upgrade request.
    Upgrading,
    /// Upgraded: messages flow both ways.
    Open,
    /// Input ended (a close, a broken frame, a message too large, a failed upgrade):
    /// nothing more is read.
    Done,
}

/// One WebSocket session's protocol state.
#[derive(Debug)]
pub struct WsState {
    phase: Phase,
    /// Bytes of the upgrade request, or of an incomplete frame, carried to the next read.
    /// Bounded: [`MAX_REQUEST`], or one frame of at most the frame limit plus its header.
    carry: Vec<u8>,
    /// A fragmented binary message being assembled, and its payload so far.
    assembling: bool,
    message: Vec<u8>,
    /// The close frame is written: nothing may follow it.
    close_sent: bool,
    /// The code the gateway's own close carries ([`WsState::close_code`]): why input
    /// ended, if it ended on something refused.
    failed_with: Option<u16>,
    /// What to tell the client, as one message, once upgraded: a refusal (the gateway is
    /// full), as a length-delimited frame.
    refusal: Option<Vec<u8>>,
}

/// What one read brought besides frames for the core.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The upgrade completed with this read.
    pub upgraded: bool,
    /// The session ends: the close after what is written (the client closed, sent
    /// something broken, or the upgrade failed or was refused).
    pub ended: bool,
    /// The upgrade failed (answered with an HTTP error).
    pub upgrade_failed: bool,
    /// A whole frame waits because `pay` refused it: it and everything behind it stay
    /// unread until the next [`WsState::read`] (with no new bytes, once the budget has
    /// refilled).
    pub waiting: bool,
    /// Frames read that are no whole message by themselves: pieces of fragmented messages
    /// (the message they complete reaches the core as one frame), pings and pongs.
    pub fragments: u32,
    pub pings: u32,
    pub pongs: u32,
}

impl WsState {
    /// A session about to upgrade; `refusal` (a length-delimited frame) is sent instead of
    /// serving it, once upgraded.
    pub fn new(refusal: Option<Vec<u8>>) -> Self {
        WsState {
            phase: Phase::Upgrading,
            carry: Vec::new(),
            message: Vec::new(),
            assembling: false,
            close_sent: false,
            failed_with: None,
            refusal,
        }
    }

    /// The code for the close frame the gateway sends when it ends the session: 1002, 1003
    /// or 1009 if the client's input ended on a broken frame, a text message or a message
    /// over the frame limit (RFC 6455 section 7.4.1), else 1000.
    pub fn close_code(&self) -> u16 {
        self.failed_with.unwrap_or(CLOSE_NORMAL)
    }

    /// Protocol messages may be written: upgraded and not closed.
    pub fn writable(&self) -> bool {
        self.phase != Phase::Upgrading && !self.close_sent && self.refusal.is_none()
    }

    /// Bytes held between reads: an incomplete frame, the message being assembled, and
    /// while frames wait for the input budget everything that arrived behind them (which
    /// the caller bounds).
    pub fn held(&self) -> usize {
        self.carry.len() + self.message.len()
    }

    /// Reads nothing more and lets go of what was held (the caller cut the client off).
    pub fn stop_reading(&mut self) {
        self.phase = Phase::Done;
        self.carry = Vec::new();
        self.message = Vec::new();
        self.assembling = false;
    }

    /// Handles bytes read from the socket (after what waited from earlier reads; `data` may
    /// be empty to go on with that). Each whole frame is first paid for: `pay` gets its
    /// size on the wire and says whether the connection's input budget covers it; if not,
    /// it waits unread ([`Read::waiting`]). Client messages are appended to `frames` as
    /// length-delimited frames (already paid for, as the frames they came in); what the
    /// protocol answers by itself (the upgrade's response, pongs, the close) to `out`.
    /// `max_frame` is the core's frame limit.
    pub fn read(
        &mut self,
        data: &[u8],
        max_frame: usize,
        pay: &mut impl FnMut(usize) -> bool,
        frames: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Read {
        let mut read = Read::default();
        let mut data = data;
        if self.phase == Phase::Upgrading {
            match self.upgrade(data, out) {
                Upgrading::Pending => return read,
                Upgrading::Failed => {
                    // The HTTP error is all that is written: no close frame follows it.
                    self.phase = Phase::Done;
                    self.close_sent = true;
                    self.carry = Vec::new();
                    read.upgrade_failed = true;
                    read.ended = true;
                    return read;
                }
                Upgrading::Done { request_len, taken } => {
                    read.upgraded = true;
                    self.phase = Phase::Open;
                    if let Some(refusal) = self.refusal.take() {
                        write_frames(out, &refusal);
                        self.close(out, CLOSE_NORMAL);
                        self.phase = Phase::Done;
                        self.carry = Vec::new();
                        read.ended = true;
                        return read;
                    }
                    // Frames the client sent right behind its request (it may not have
                    // waited for the answer) are read as any others.
                    let mut carried = std::mem::take(&mut self.carry);
                    carried.drain(..request_len);
                    self.carry = carried;
                    data = &data[taken..];
                }
            }
        }
        if self.phase != Phase::Open || (data.is_empty() && self.carry.is_empty()) {
            return read;
        }
        if self.carry.is_empty() {
            let used = self.frames(data, max_frame, pay, frames, out, &mut read);
            if self.phase == Phase::Open {
                self.carry.extend_from_slice(&data[used..]);
            }
        } else {
            let mut carried = std::mem::take(&mut self.carry);
            carried.extend_from_slice(data);
            let used = self.frames(&carried, max_frame, pay, frames, out, &mut read);
            if self.phase == Phase::Open {
                carried.drain(..used);
                self.carry = carried;
            }
        }
        read
    }

    /// Writes the close frame (once); nothing is written after it.
    pub fn close(&mut self, out: &mut Vec<u8>, code: u16) {
        self.close_with(out, Some(code));
    }

    /// Writes the close frame (once) with `code`, or with an empty body.
    fn close_with(&mut self, out: &mut Vec<u8>, code: Option<u16>) {
        if self.close_sent || self.phase == Phase::Upgrading {
            return;
        }
        self.close_sent = true;
        match code {
            Some(code) => {
                header(out, CLOSE, 2);
                out.extend_from_slice(&code.to_be_bytes());
            }
            None => header(out, CLOSE, 0),
        }
    }

    /// Reads the upgrade request from the carried bytes and `data`.
    fn upgrade(&mut self, data: &[u8], out: &mut Vec<u8>) -> Upgrading {
        let room = MAX_REQUEST + MAX_REQUEST - self.carry.len().min(MAX_REQUEST);
        let taken = data.len().min(room);
        self.carry.extend_from_slice(&data[..taken]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let length = match request.parse(&self.carry) {
            Ok(httparse::Status::Complete(length)) if length <= MAX_REQUEST => length,
            Ok(httparse::Status::Partial) if self.carry.len() <= MAX_REQUEST => {
                return Upgrading::Pending
            }
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                http_error(out, "431 Request Header Fields Too Large", "", "request too large");
                return Upgrading::Failed;
            }
            Err(error) => {
                http_error(out, "400 Bad Request", "", &format!("not an HTTP request: {error}"));
                return Upgrading::Failed;
            }
        };
        match accept(&request) {
            Ok(response) => {
                out.extend_from_slice(response.as_bytes());
                Upgrading::Done { request_len: length, taken }
            }
            Err(Refused::Version) => {
                http_error(
                    out,
                    "426 Upgrade Required",
                    "Sec-WebSocket-Version: 13\r\n",
                    "WebSocket version 13 only",
                );
                Upgrading::Failed
            }
            Err(Refused::Bad(why)) => {
                http_error(out, "400 Bad Request", "", why);
                Upgrading::Failed
            }
        }
    }

    /// Decodes whole frames from `data`, each paid for first; returns the bytes used. An
    /// incomplete frame, or one `pay` refuses, is left for the next read.
    fn frames(
        &mut self,
        data: &[u8],
        max_frame: usize,
        pay: &mut impl FnMut(usize) -> bool,
        frames: &mut Vec<u8>,
        out: &mut Vec<u8>,
        read: &mut Read,
    ) -> usize {
        let mut used = 0;
        while self.phase == Phase::Open {
            let rest = &data[used..];
            let head = match FrameHead::parse(rest) {
                Parsed::Incomplete => break,
                Parsed::Broken => {
                    self.fail(frames, &UNDECODABLE, CLOSE_PROTOCOL_ERROR);
                    break;
                }
                Parsed::Head(head) => head,
            };
            let is_data = matches!(head.opcode, CONTINUATION | TEXT | BINARY);
            if is_data {
                let so_far = self.message.len() as u64;
                if so_far + head.len > max_frame as u64 {
                    // Only the length matters to the core: it refuses the message at once.
                    let mut prefix = Vec::with_capacity(10);
                    prost::encoding::encode_varint(so_far + head.len, &mut prefix);
                    self.fail(frames, &prefix, CLOSE_TOO_BIG);
                    break;
                }
            }
            let len = head.len as usize; // within the frame limit or 125 (control)
            if rest.len() < head.size + len {
                break;
            }
            if !pay(head.size + len) {
                // Over budget: this frame and all behind it wait, unread.
                read.waiting = true;
                break;
            }
            let payload = &rest[head.size..head.size + len];
            used += head.size + len;
            match (head.opcode, head.fin, self.assembling) {
                (BINARY, true, false) => {
                    // The common case: one frame, one message, straight to the core.
                    prost::encoding::encode_varint(head.len, frames);
                    unmask_into(frames, payload, head.mask);
                }
                (BINARY, false, false) => {
                    read.fragments += 1;
                    self.assembling = true;
                    self.message.clear();
                    unmask_into(&mut self.message, payload, head.mask);
                }
                (CONTINUATION, fin, true) => {
                    read.fragments += 1;
                    unmask_into(&mut self.message, payload, head.mask);
                    if fin {
                        self.assembling = false;
                        prost::encoding::encode_varint(self.message.len() as u64, frames);
                        frames.extend_from_slice(&self.message);
                        self.message.clear();
                    }
                }
                (PING, _, _) => {
                    read.pings += 1;
                    if self.writable() {
                        header(out, PONG, len);
                        unmask_into(out, payload, head.mask);
                    }
                }
                (PONG, _, _) => read.pongs += 1,
                (CLOSE, _, _) => {
                    let mut body = Vec::with_capacity(len); // a control frame: at most 125
                    unmask_into(&mut body, payload, head.mask);
                    self.close_with(out, close_reply(&body));
                    self.phase = Phase::Done;
                    read.ended = true;
                }
                // Text: no protocol message is.
                (TEXT, _, false) => self.fail(frames, &UNDECODABLE, CLOSE_UNSUPPORTED_DATA),
                // A new message inside a fragmented one, a continuation of nothing, or a
                // fragmented control frame.
                _ => self.fail(frames, &UNDECODABLE, CLOSE_PROTOCOL_ERROR),
            }
        }
        used
    }

    /// Input ends on something the core refuses (and then closes the connection).
    fn fail(&mut self, frames: &mut Vec<u8>, refused: &[u8], code: u16) {
        frames.extend_from_slice(refused);
        self.failed_with = Some(code);
        self.phase = Phase::Done;
        self.carry = Vec::new();
        self.message = Vec::new();
    }
}

/// The code to answer a client's close with (its body unmasked): the client's own if a
/// peer may send it, 1002 for any other or a body too short to hold one, 1007 for a reason
/// that is not UTF-8, none if the client gave none (RFC 6455 sections 5.5.1 and 7.4).
fn close_reply(body: &[u8]) -> Option<u16> {
    let (code, reason) = match body {
        [] => return None,
        [_] => return Some(CLOSE_PROTOCOL_ERROR),
        [high, low, reason @ ..] => (u16::from_be_bytes([*high, *low]), reason),
    };
    // 1004-1006 and 1015 are reserved (1005 and 1006 stand for "no code" and "no close
    // frame" and are never sent); below 1000 and 1016-2999 are not assigned.
    if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
        return Some(CLOSE_PROTOCOL_ERROR);
    }
    if std::str::from_utf8(reason).is_err() {
        return Some(CLOSE_INVALID_DATA);
    }
    Some(code)
}

enum Upgrading {
    Pending,
    Failed,
    /// Upgraded: the carried bytes past the request's `request_len`, then `data` past the
    /// `taken` bytes carried from it, are the first frames.
    Done {
        request_len: usize,
        taken: usize,
    },
}

enum Refused {
    Version,
    Bad(&'static str),
}

/// The `101 Switching Protocols` answer to a valid upgrade request.
fn accept(request: &httparse::Request<'_, '_>) -> Result<String, Refused> {
    if request.method != Some("GET") {
        return Err(Refused::Bad("a WebSocket upgrade is a GET"));
    }
    let values = |name: &'static str| {
        request
            .headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
    };
    let has_token = |name: &'static str, token: &str| {
        values(name).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(Refused::Bad(
            "not a WebSocket upgrade (Upgrade: websocket, Connection: upgrade)",
        ));
    }
    if !values("sec-websocket-version").any(|v| v.trim() == "13") {
        return Err(Refused::Version);
    }
    let key = values("sec-websocket-key").next().map(str::trim).unwrap_or("");
    let decoded = base64::engine::general_purpose::STANDARD.decode(key).unwrap_or_default();
    if decoded.len() != 16 {
        return Err(Refused::Bad("Sec-WebSocket-Key is not 16 bytes in base64"));
    }
    let offered = has_token("sec-websocket-protocol", SUBPROTOCOL);
    let mut response = String::with_capacity(160);
    response.push_str(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    );
    response.push_str("Sec-WebSocket-Accept: ");
    response.push_str(&accept_key(key));
    response.push_str("\r\n");
    if offered {
        response.push_str("Sec-WebSocket-Protocol: ");
        response.push_str(SUBPROTOCOL);
        response.push_str("\r\n");
    }
    response.push_str("\r\n");
    Ok(response)
}

/// `base64(SHA-1(key || GUID))`, the proof the server read the key.
pub fn accept_key(key: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    context.update(key.as_bytes());
    context.update(GUID);
    base64::engine::general_purpose::STANDARD.encode(context.finish())
}

fn http_error(out: &mut Vec<u8>, status: &str, extra_headers: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\n{extra_headers}Content-Type: text/plain\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    out.extend_from_slice(response.as_bytes());
}

struct FrameHead {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Payload length.
    len: u64,
    /// Header length.
    size: usize,
}

enum Parsed {
    Incomplete,
    Broken,
    Head(FrameHead),
}

impl FrameHead {
    fn parse(data: &[u8]) -> Parsed {
        let [first, second, ..] = *data else { return Parsed::Incomplete };
        let (fin, rsv, opcode) = (first & FIN != 0, first & 0x70, first & 0x0f);
        let masked = second & 0x80 != 0;
        if rsv != 0
            || !masked
            || !matches!(opcode, CONTINUATION | TEXT | BINARY | CLOSE | PING | PONG)
        {
            return Parsed::Broken;
        }
        let (len, at) = match second & 0x7f {
            126 => match data.get(2..4) {
                Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
                None => return Parsed::Incomplete,
            },
            127 => match data.get(2..10) {
                Some(b) => {
                    let len = u64::from_be_bytes(b.try_into().expect("8 bytes"));
                    if len >> 63 != 0 {
                        return Parsed::Broken;
                    }
                    (len, 10)
                }
                None => return Parsed::Incomplete,
            },
            short => (u64::from(short), 2),
        };
        if opcode >= CLOSE && (!fin || len > 125) {
            return Parsed::Broken;
        }
        let Some(mask) = data.get(at..at + 4) else { return Parsed::Incomplete };
        let mask = [mask[0], mask[1], mask[2], mask[3]];
        Parsed::Head(FrameHead { fin, opcode, mask, len, size: at + 4 })
    }
}

/// Appends `payload` unmasked.
fn unmask_into(into: &mut Vec<u8>, payload: &[u8], mask: [u8; 4]) {
    let start = into.len();
    into.extend_from_slice(payload);
    let key = u32::from_ne_bytes(mask);
    let bytes = &mut into[start..];
    let mut words = bytes.chunks_exact_mut(4);
    for word in &mut words {
        let value = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]) ^ key;
        word.copy_from_slice(&value.to_ne_bytes());
    }
    for (i, byte) in words.into_remainder().iter_mut().enumerate() {
        *byte ^= mask[i];
    }
}

/// A server frame's header (servers do not mask).
fn header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(FIN | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// Appends length-delimited frames (a shard's delivery) as binary WebSocket messages, one
/// per frame. A malformed tail (never written by a shard) is dropped.
pub fn write_frames(out: &mut Vec<u8>, mut delimited: &[u8]) {
    while let Ok(Some(frame)) = meridian_protocol::next_frame(delimited, usize::MAX) {
        let body = frame.body(delimited);
        header(out, BINARY, body.len());
        out.extend_from_slice(body);
        delimited = &delimited[frame.total_len()..];
    }
}

/// Appends one protobuf message as a binary WebSocket message.
pub fn write_message(out: &mut Vec<u8>, message: &impl Message) {
    header(out, BINARY, message.encoded_len());
    // A Vec grows as needed: encoding into it cannot fail.
    let _ = message.encode(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn request(extra: &str) -> Vec<u8> {
        format!(
            "GET /play HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, \
             Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
        .into_bytes()
    }

    /// A client frame: masked with a fixed key.
    fn client_frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut frame = vec![first];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        frame
    }

    /// A budget that pays for everything.
    fn free(_size: usize) -> bool {
        true
    }

    fn upgraded() -> WsState {
        let mut state = WsState::new(None);
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        let read = state.read(&request(""), 4096, &mut free, &mut frames, &mut out);
        assert!(read.upgraded && !read.ended);
        state
    }

    fn bodies(frames: &[u8]) -> Vec<Vec<u8>> {
        let mut at = 0;
        let mut all = Vec::new();
        while let Ok(Some(frame)) = meridian_protocol::next_frame(&frames[at..], usize::MAX) {
            all.push(frame.body(&frames[at..]).to_vec());
            at += frame.total_len();
        }
        all
    }

    #[test]
    fn the_accept_key_is_the_rfcs_example() {
        assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn an_upgrade_split_anywhere_is_answered_once_and_agrees_to_the_subprotocol() {
        let whole = request("Sec-WebSocket-Protocol: chat, meridian.v1\r\n");
        for cut in 1..whole.len() {
            let mut state = WsState::new(None);
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            assert_eq!(
                state.read(&whole[..cut], 4096, &mut free, &mut frames, &mut out),
                Read::default()
            );
            assert!(out.is_empty() && state.phase == Phase::Upgrading);
            let read = state.read(&whole[cut..], 4096, &mut free, &mut frames, &mut out);
            assert!(read.upgraded, "cut at {cut}");
            let response = String::from_utf8(out).unwrap();
            assert!(response.starts_with("HTTP/1.1 101 "), "{response}");
            assert!(response.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
            assert!(response.contains("Sec-WebSocket-Protocol: meridian.v1\r\n"));
            assert!(frames.is_empty() && state.writable());
        }
    }

    #[test]
    fn bad_upgrades_get_an_http_error_and_end() {
        let cases: [(Vec<u8>, &str); 5] = [
            (b"POST / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n".to_vec(), "400"),
            (b"\x16\x03\x01 not http at all\r\n\r\n".to_vec(), "400"),
            (request("").iter().map(|&b| if b == b'3' { b'8' } else { b }).collect(), "426"),
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "400"),
            (
                format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_REQUEST)).into_bytes(),
                "431",
            ),
        ];
        for (bytes, status) in cases {
            let mut state = WsState::new(None);
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            let read = state.read(&bytes, 4096, &mut free, &mut frames, &mut out);
            assert!(read.ended && read.upgrade_failed, "{}", String::from_utf8_lossy(&bytes));
            let response = String::from_utf8(out).unwrap();
            assert!(response.starts_with(&format!("HTTP/1.1 {status}")), "{response}");
            assert!(frames.is_empty() && !state.writable());
        }
    }

    #[test]
    fn an_endless_request_is_refused_at_the_bound_without_keeping_more() {
        let mut state = WsState::new(None);
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        let chunk = vec![b'a'; 1000];
        let mut ended = false;
        state.read(b"GET / HTTP/1.1\r\nX: ", 4096, &mut free, &mut frames, &mut out);
        for _ in 0..20 {
            let read = state.read(&chunk, 4096, &mut free, &mut frames, &mut out);
            assert!(state.held() <= 2 * MAX_REQUEST);
            if read.ended {
                ended = true;
                break;
            }
        }
        assert!(ended);
        assert!(String::from_utf8(out).unwrap().starts_with("HTTP/1.1 431"));
    }

    #[test]
    fn binary_messages_become_the_frames_tcp_carries_however_they_arrive() {
        let messages: Vec<Vec<u8>> =
            vec![vec![8, 1], vec![7; 125], vec![9; 126], vec![3; 4096], vec![]];
        let mut stream = Vec::new();
        for message in &messages {
            stream.extend(client_frame(FIN | BINARY, message));
        }
        // Fragmented, with a ping between the fragments.
        stream.extend(client_frame(BINARY, &[1, 2]));
        stream.extend(client_frame(FIN | PING, b"hi"));
        stream.extend(client_frame(CONTINUATION, &[3]));
        stream.extend(client_frame(FIN | CONTINUATION, &[4, 5]));
        for step in [1, 3, 7, 4096, stream.len()] {
            let mut state = upgraded();
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            let mut control = 0;
            for piece in stream.chunks(step) {
                let read = state.read(piece, 4096, &mut free, &mut frames, &mut out);
                assert!(!read.ended);
                control += read.pings;
            }
            let mut expected = messages.clone();
            expected.push(vec![1, 2, 3, 4, 5]);
            assert_eq!(bodies(&frames), expected, "in pieces of {step}");
            assert_eq!(control, 1);
            assert_eq!(out, [&[FIN | PONG, 2][..], b"hi"].concat(), "the ping is answered");
        }
    }

    #[test]
    fn frames_sent_right_behind_the_request_are_all_read() {
        let messages: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 4000]).collect();
        let mut bytes = request("");
        for message in &messages {
            bytes.extend(client_frame(FIN | BINARY, message));
        }
        assert!(bytes.len() > 2 * MAX_REQUEST);
        for cut in [bytes.len(), 100, MAX_REQUEST + 5] {
            let mut state = WsState::new(None);
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            let read = state.read(&bytes[..cut], 4096, &mut free, &mut frames, &mut out);
            state.read(&bytes[cut..], 4096, &mut free, &mut frames, &mut out);
            assert!(read.upgraded || cut == 100, "cut at {cut}");
            assert_eq!(bodies(&frames), messages, "cut at {cut}");
        }
    }

    #[test]
    fn text_oversized_and_broken_frames_reach_the_core_as_refusals_and_end_reading() {
        // What the core is handed, and the code the gateway's close frame then carries
        // (RFC 6455 section 7.4.1: 1003 for data it cannot take, 1009 for a message too
        // big, 1002 for a broken frame).
        let cases: [(Vec<u8>, Vec<u8>, u16); 7] = [
            (client_frame(FIN | TEXT, b"{}"), UNDECODABLE.to_vec(), CLOSE_UNSUPPORTED_DATA),
            // varint 4097
            (client_frame(FIN | BINARY, &[0; 4097]), vec![0x81, 0x20], CLOSE_TOO_BIG),
            (
                client_frame(FIN | BINARY, &[0; 70_000])[..20].to_vec(),
                vec![0xf0, 0xa2, 0x04],
                CLOSE_TOO_BIG,
            ),
            (client_frame(FIN | CONTINUATION, &[1]), UNDECODABLE.to_vec(), CLOSE_PROTOCOL_ERROR),
            (client_frame(FIN | 0x3, &[1]), UNDECODABLE.to_vec(), CLOSE_PROTOCOL_ERROR),
            (client_frame(PING, &[1]), UNDECODABLE.to_vec(), CLOSE_PROTOCOL_ERROR),
            // Unmasked.
            (vec![FIN | BINARY, 1, 8], UNDECODABLE.to_vec(), CLOSE_PROTOCOL_ERROR),
        ];
        for (bytes, refused, code) in cases {
            let mut state = upgraded();
            assert_eq!(state.close_code(), CLOSE_NORMAL, "before anything went wrong");
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            state.read(&bytes, 4096, &mut free, &mut frames, &mut out);
            assert_eq!(frames, refused);
            let more = client_frame(FIN | BINARY, &[8, 1]);
            state.read(&more, 4096, &mut free, &mut frames, &mut out);
            assert_eq!(frames, refused, "nothing is read after");
            assert_eq!(state.held(), 0);
            assert_eq!(state.close_code(), code, "{bytes:02x?}");
            state.close(&mut out, state.close_code());
            assert_eq!(out, [&[FIN | CLOSE, 2][..], &code.to_be_bytes()].concat());
        }
    }

    #[test]
    fn a_close_is_answered_once_and_ends_the_session() {
        let mut state = upgraded();
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        let read = state.read(
            &client_frame(FIN | CLOSE, &[0x03, 0xe8]),
            4096,
            &mut free,
            &mut frames,
            &mut out,
        );
        assert!(read.ended && frames.is_empty());
        assert_eq!(out, [FIN | CLOSE, 2, 0x03, 0xe8]);
        assert!(!state.writable());
        state.close(&mut out, CLOSE_NORMAL);
        assert_eq!(out.len(), 4, "one close only");
    }

    #[test]
    fn a_refused_session_is_told_once_upgraded_then_closed() {
        let mut refusal = Vec::new();
        meridian_protocol::encode_frame(
            &meridian_protocol::server::error(
                meridian_protocol::pb::ErrorCode::Unavailable,
                "server full",
                0,
            ),
            &mut refusal,
        );
        let mut state = WsState::new(Some(refusal.clone()));
        assert!(!state.writable());
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        let read = state.read(&request(""), 4096, &mut free, &mut frames, &mut out);
        assert!(read.upgraded && read.ended);
        let body = &refusal[1..];
        let tail =
            [&[FIN | BINARY, body.len() as u8][..], body, &[FIN | CLOSE, 2, 0x03, 0xe8]].concat();
        assert!(out.ends_with(&tail));
    }

    #[test]
    fn every_frame_is_paid_for_before_it_is_read_and_waits_unread_when_refused() {
        let pieces = [
            client_frame(BINARY, &[1, 2]),
            client_frame(FIN | PING, b"hi"),
            client_frame(CONTINUATION, &[]),
            client_frame(FIN | CONTINUATION, &[3, 4, 5]),
            client_frame(FIN | PONG, b""),
            client_frame(FIN | BINARY, &[8, 1]),
        ];
        let stream = pieces.concat();
        let mut state = upgraded();
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        let mut paid = Vec::new();
        let mut refuse = |_| false;
        let read = state.read(&stream, 4096, &mut refuse, &mut frames, &mut out);
        assert!(read.waiting && !read.ended);
        assert!(frames.is_empty() && out.is_empty(), "nothing is read before it is paid for");
        assert_eq!(state.held(), stream.len(), "everything waits, unread");

        let mut allowance = 2;
        let mut pay = |size| {
            if allowance == 0 {
                return false;
            }
            allowance -= 1;
            paid.push(size);
            true
        };
        let read = state.read(&[], 4096, &mut pay, &mut frames, &mut out);
        assert!(read.waiting);
        assert_eq!((read.fragments, read.pings), (1, 1));
        assert_eq!(out, [&[FIN | PONG, 2][..], b"hi"].concat(), "the paid ping is answered");
        assert!(frames.is_empty(), "the message is not whole yet");

        let mut pay = |size| {
            paid.push(size);
            true
        };
        let read = state.read(&[], 4096, &mut pay, &mut frames, &mut out);
        assert!(!read.waiting);
        assert_eq!((read.fragments, read.pongs), (2, 1));
        assert_eq!(bodies(&frames), vec![vec![1, 2, 3, 4, 5], vec![8, 1]]);
        assert_eq!(paid, pieces.iter().map(Vec::len).collect::<Vec<_>>(), "each frame, once");
        assert_eq!(state.held(), 0);
    }

    #[test]
    fn a_close_is_answered_with_a_code_a_peer_may_send() {
        let code = |c: u16| c.to_be_bytes().to_vec();
        let with_reason = |c: u16, reason: &[u8]| [&c.to_be_bytes()[..], reason].concat();
        let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (vec![], vec![]),
            (code(1000), code(1000)),
            (code(1001), code(1001)),
            (code(1011), code(1011)),
            (code(3000), code(3000)),
            (with_reason(4999, b"bye"), code(4999)),
            (vec![0x03], code(1002)),
            (code(0), code(1002)),
            (code(999), code(1002)),
            (code(1004), code(1002)),
            (code(1005), code(1002)),
            (code(1006), code(1002)),
            (code(1015), code(1002)),
            (code(1016), code(1002)),
            (code(2999), code(1002)),
            (code(5000), code(1002)),
            (with_reason(1000, &[0xff, 0xfe]), code(1007)),
        ];
        for (body, answer) in cases {
            let mut state = upgraded();
            let (mut frames, mut out) = (Vec::new(), Vec::new());
            let frame = client_frame(FIN | CLOSE, &body);
            let read = state.read(&frame, 4096, &mut free, &mut frames, &mut out);
            assert!(read.ended && frames.is_empty(), "{body:?}");
            let expected = [&[FIN | CLOSE, answer.len() as u8][..], &answer].concat();
            assert_eq!(out, expected, "the answer to a close with {body:?}");
        }
    }

    #[test]
    fn server_messages_get_the_shortest_header() {
        for len in [0usize, 125, 126, 65_535, 65_536] {
            let mut delimited = Vec::new();
            prost::encoding::encode_varint(len as u64, &mut delimited);
            delimited.extend(std::iter::repeat_n(5u8, len));
            let mut out = Vec::new();
            write_frames(&mut out, &[delimited.clone(), delimited].concat());
            let size = match len {
                0..=125 => 2,
                126..=65_535 => 4,
                _ => 10,
            };
            assert_eq!(out.len(), 2 * (size + len), "len {len}");
            assert_eq!(out[0], FIN | BINARY);
        }
        let message = meridian_protocol::server::moved(1, 5, 5, 1);
        let mut out = Vec::new();
        write_message(&mut out, &message);
        assert_eq!(out[1] as usize, message.encoded_len());
        assert_eq!(&out[2..], message.encode_to_vec());
    }
}
