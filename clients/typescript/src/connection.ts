/**
 * A player's connection to a Meridian gateway over WebSocket: logs in, keeps itself alive,
 * resumes on its own after a drop (on another gateway of the cluster when it knows more than
 * one), and turns moves and actions into promises settled by their answers. What the player
 * sees is kept in `connection.view`.
 *
 * One binary WebSocket message carries exactly one protobuf body, with no length prefix.
 * The protocol itself is described in `proto/client.proto` (normative) and `docs/protocol.md`.
 */
import { AnswerBook } from "./answers.js";
import { Emitter } from "./emitter.js";
import { MeridianError, type ProtocolViolation } from "./errors.js";
import { DEFAULT_MAX_FRAME_BYTES } from "./framing.js";
import { Direction, ErrorCode, type ServerMessage } from "./gen/client_pb.js";
import { decodeServerMessage, encodeClientMessage, toPoint, type ClientMessageInit, type Point } from "./messages.js";
import { globalWebSocket, WEBSOCKET_OPEN, type WebSocketConstructor, type WebSocketLike } from "./transport.js";
import { View, type WorldInfo } from "./view.js";

export interface ConnectionOptions {
  /** The WebSocket class; defaults to the global one (browsers, Node >= 22). On Node 20 pass `ws`'s. */
  WebSocket?: WebSocketConstructor;
  /** Send a Ping after this long without sending anything (the server closes after 120 s). Default 30 s. */
  keepAliveMs?: number;
  /** How long after a drop the server keeps the player for `Resume`. Default 30 s. */
  resumeWindowMs?: number;
  /** First wait between resume attempts, doubled after each failure up to `reconnectMaxDelayMs`. Default 250 ms. */
  reconnectDelayMs?: number;
  /** Default 5 s. */
  reconnectMaxDelayMs?: number;
  /** Give up opening one WebSocket after this long. Default 10 s. */
  openTimeoutMs?: number;
  /** Largest message body sent; larger ones are refused before sending. Default 4096. */
  maxFrameBytes?: number;
  /** Randomness in [0, 1) that spreads reconnections (so a gateway that restarts is not stormed). */
  random?: () => number;
  /**
   * More WebSocket addresses of gateways of the same cluster. The connection's addresses are
   * `[url, ...gateways]`, duplicates left out, in that order: each resume attempt goes to the
   * next one after the address that failed, round-robin, so that a gateway shutting down
   * (`SHUTTING_DOWN`) or gone away does not take the player with it. Default none: every
   * resume attempt goes to `url`.
   */
  gateways?: string[];
}

/** What `LoginOk` says. */
export interface LoginInfo extends WorldInfo {
  /** Given back in `Resume` after a drop; the connection does that on its own. Good once:
   * each resume's `ViewReset` brings the next (and `info` then carries it). */
  readonly resumeToken: Uint8Array;
}

export interface LoginOptions {
  /** Where to appear; honoured by servers in dev mode only. */
  spawn?: Point;
  /** Authentication token (a JWT from the studio's login service) outside dev mode. */
  token?: string;
}

export interface ActionOptions {
  /** The entity acted on, 0n (the default) for none. */
  target?: bigint;
  /** Game-defined bytes, at most 1024. */
  payload?: Uint8Array;
}

export type ConnectionState = "open" | "loggingIn" | "playing" | "resuming" | "closed";

export type CloseReason =
  /** `logout()` was called. */
  | "logout"
  /** `close()` was called. */
  | "closed"
  /** Another login of the same account took over (`REPLACED`); not resumed. */
  | "replaced"
  /** The connection dropped before a login succeeded: there was nothing to resume. */
  | "dropped"
  /** No resume attempt succeeded within the resume window. */
  | "resume-failed";

export interface ConnectionEvents {
  /**
   * The connection dropped; resume attempts begin. Moves and actions pending were rejected.
   * `reason` is "the connection dropped", or "the gateway is shutting down" after `SHUTTING_DOWN`.
   */
  resuming: { reason: string };
  /**
   * `Resume` was accepted (`ViewReset`); the view was cleared and `Entered` for everything in sight follows.
   * `url` is the gateway's address the connection is on from now on (`connection.currentUrl`).
   */
  resumed: { position: Point; attempts: number; url: string };
  /** For good: nothing more is sent or received. */
  closed: { reason: CloseReason; error?: MeridianError };
  /**
   * An error from the server that answers no move or action (a chat refused, `SHUTTING_DOWN`...).
   * After `SHUTTING_DOWN` the gateway closes, and the connection resumes on the next address.
   */
  error: MeridianError;
  /** The server broke the protocol; reported, not thrown. The view's violations are relayed here too. */
  violation: ProtocolViolation;
  /** The answer to a keep-alive Ping. */
  pong: { clientTime: bigint; roundTripMs: number };
}

export type DirectionName = "up" | "down" | "left" | "right";

const DIRECTIONS: Record<DirectionName, Direction> = {
  up: Direction.UP,
  down: Direction.DOWN,
  left: Direction.LEFT,
  right: Direction.RIGHT,
};

type Settled<T> = { resolve: (value: T) => void; reject: (error: MeridianError) => void };

type AttemptOutcome = { kind: "resumed" } | { kind: "retry"; error?: MeridianError } | { kind: "fatal"; error: MeridianError };

export class Connection extends Emitter<ConnectionEvents> {
  /** What the player sees; fed by this connection. */
  readonly view = new View();
  /** The address first connected to (the one `connect` was given). */
  readonly url: string;

  readonly #WebSocket: WebSocketConstructor;
  readonly #keepAliveMs: number;
  readonly #resumeWindowMs: number;
  readonly #reconnectDelayMs: number;
  readonly #reconnectMaxDelayMs: number;
  readonly #openTimeoutMs: number;
  readonly #maxFrameBytes: number;
  readonly #random: () => number;
  /** Every address the connection may use, `url` first, without duplicates. */
  readonly #urls: readonly string[];
  /** Where in `#urls` the address in use (or being tried, while resuming) is. */
  #urlIndex = 0;

  #state: ConnectionState = "open";
  #socket: WebSocketLike | undefined;
  #answers = new AnswerBook();
  /** Pings not yet answered, by client_time, with when they were sent. */
  #pings = new Map<bigint, number>();
  #login: (Settled<LoginInfo> & { name: string }) | undefined;
  #info: LoginInfo | undefined;
  #lastSentAt = 0;
  #keepAliveTimer: ReturnType<typeof setTimeout> | undefined;
  /** An error after which the server closes and no resume is tried (`REPLACED`). */
  #fatal: MeridianError | undefined;
  /** The gateway in use said `SHUTTING_DOWN`: the close that follows is a planned move elsewhere, not a failure. */
  #shuttingDown: MeridianError | undefined;
  #resumeAttempt: { settle: (outcome: AttemptOutcome) => void; attempts: number } | undefined;
  /** Ends the wait between resume attempts early (on `close()`). */
  #wake: (() => void) | undefined;
  #closeWaiters: (() => void)[] = [];

  private constructor(url: string, options: ConnectionOptions) {
    super();
    this.url = url;
    const WebSocket = options.WebSocket ?? globalWebSocket();
    if (WebSocket === undefined) {
      throw new TypeError("no global WebSocket (Node < 22?): pass one as options.WebSocket, e.g. the `ws` package's");
    }
    this.#WebSocket = WebSocket;
    this.#keepAliveMs = options.keepAliveMs ?? 30_000;
    this.#resumeWindowMs = options.resumeWindowMs ?? 30_000;
    this.#reconnectDelayMs = options.reconnectDelayMs ?? 250;
    this.#reconnectMaxDelayMs = options.reconnectMaxDelayMs ?? 5_000;
    this.#openTimeoutMs = options.openTimeoutMs ?? 10_000;
    this.#maxFrameBytes = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#random = options.random ?? Math.random;
    this.#urls = [...new Set([url, ...(options.gateways ?? [])])];
    this.view.on("violation", (violation) => this.emit("violation", violation));
  }

  /**
   * Opens a WebSocket to `url` (`ws://host:port/`); resolves once it is open. Resumes go to
   * `options.gateways` too, in turn, but this first connection is to `url` only.
   */
  static async connect(url: string, options: ConnectionOptions = {}): Promise<Connection> {
    const connection = new Connection(url, options);
    const socket = await connection.#open(url, connection.#openTimeoutMs);
    connection.#use(socket);
    return connection;
  }

  get state(): ConnectionState {
    return this.#state;
  }

  /**
   * The gateway's address the connection is on now: `url` until a resume moves it to another
   * of `options.gateways`; while resuming, the address being tried.
   */
  get currentUrl(): string {
    return this.#urls[this.#urlIndex] ?? this.url;
  }

  /** What `LoginOk` said, once logged in. */
  get info(): LoginInfo | undefined {
    return this.#info;
  }

  /** Logs in as `name` (1 to 32 bytes of UTF-8). Rejects with the server's `Error` (`INVALID_TOKEN`...). */
  login(name: string, options: LoginOptions = {}): Promise<LoginInfo> {
    if (this.#state !== "open") {
      return Promise.reject(this.#notNow("log in"));
    }
    const body = this.#encode({
      kind: {
        case: "login",
        value: { name, token: options.token ?? "", ...(options.spawn ? { spawn: options.spawn } : {}) },
      },
    });
    return new Promise<LoginInfo>((resolve, reject) => {
      this.#state = "loggingIn";
      this.#login = { resolve, reject, name };
      this.#transmit(body);
    });
  }

  /** Moves one square; resolves with the position the server acknowledged. */
  move(direction: Direction | DirectionName): Promise<Point> {
    if (this.#state !== "playing") return Promise.reject(this.#notNow("move"));
    const clientTime = this.#answers.nextClientTime();
    const wireDirection = typeof direction === "string" ? DIRECTIONS[direction] : direction;
    const body = this.#encode({ kind: { case: "move", value: { direction: wireDirection, clientTime } } });
    const answer = this.#answers.expectMove(clientTime);
    this.#transmit(body);
    return answer;
  }

  /** A game-defined command; resolves with `ActionDone.payload`, rejects with `REJECTED` and others. */
  action(kind: number, options: ActionOptions = {}): Promise<Uint8Array> {
    if (this.#state !== "playing") return Promise.reject(this.#notNow("act"));
    const clientTime = this.#answers.nextClientTime();
    let body: Uint8Array;
    try {
      body = this.#encode({
        kind: {
          case: "action",
          value: { kind, target: options.target ?? 0n, payload: options.payload ?? new Uint8Array(), clientTime },
        },
      });
    } catch (error) {
      return Promise.reject(error);
    }
    const answer = this.#answers.expectAction(clientTime);
    this.#transmit(body);
    return answer;
  }

  /** Says `text` (1 to 256 bytes) to those in sight. A refusal comes as an `error` event. */
  chat(text: string): void {
    if (this.#state !== "playing") throw this.#notNow("chat");
    this.#transmit(this.#encode({ kind: { case: "chat", value: { text } } }));
  }

  /**
   * Leaves the world for good (no resume) and closes; resolves once the socket is closed.
   * While resuming there is no server to tell: the player is dropped when its window ends.
   */
  logout(): Promise<void> {
    if (this.#state === "playing") {
      this.#transmit(this.#encode({ kind: { case: "logout", value: {} } }));
    }
    return this.#shutDown("logout", "logged out before the answer");
  }

  /** Closes without logging out: the server keeps the player for the resume window. */
  close(): Promise<void> {
    return this.#shutDown("closed", "the connection was closed before the answer");
  }

  #notNow(what: string): MeridianError {
    const code = this.#state === "open" || this.#state === "loggingIn" ? ErrorCode.NOT_LOGGED_IN : ErrorCode.UNAVAILABLE;
    return new MeridianError(code, `cannot ${what} while the connection is ${this.#state}`, 0n, true);
  }

  #encode(message: ClientMessageInit): Uint8Array {
    const body = encodeClientMessage(message);
    if (body.length > this.#maxFrameBytes) {
      throw new MeridianError(
        ErrorCode.FRAME_TOO_LARGE,
        `message of ${body.length} bytes exceeds ${this.#maxFrameBytes}`,
        0n,
        true,
      );
    }
    return body;
  }

  #transmit(body: Uint8Array): void {
    const socket = this.#socket;
    // A socket that is closing drops what is sent; its close event starts a resume.
    if (socket === undefined || socket.readyState !== WEBSOCKET_OPEN) return;
    socket.send(body);
    this.#lastSentAt = Date.now();
  }

  #open(url: string, timeoutMs: number): Promise<WebSocketLike> {
    return new Promise((resolve, reject) => {
      let socket: WebSocketLike;
      try {
        socket = new this.#WebSocket(url);
      } catch (error) {
        reject(new MeridianError(ErrorCode.UNAVAILABLE, `cannot open a WebSocket to ${url}: ${String(error)}`, 0n, true));
        return;
      }
      socket.binaryType = "arraybuffer";
      const timer = setTimeout(() => {
        socket.onclose = null;
        closeQuietly(socket);
        reject(new MeridianError(ErrorCode.UNAVAILABLE, `no WebSocket to ${url} within ${timeoutMs} ms`, 0n, true));
      }, timeoutMs);
      socket.onerror = () => {
        // A close event follows, with the code.
      };
      socket.onopen = () => {
        clearTimeout(timer);
        resolve(socket);
      };
      socket.onclose = (event) => {
        clearTimeout(timer);
        reject(
          new MeridianError(ErrorCode.UNAVAILABLE, `WebSocket to ${url} closed before opening (code ${event.code})`, 0n, true),
        );
      };
    });
  }

  /** Makes `socket` the connection's; events from sockets it replaced are ignored. */
  #use(socket: WebSocketLike): void {
    this.#socket = socket;
    socket.onopen = null;
    socket.onerror = () => {};
    socket.onmessage = (event) => {
      if (socket === this.#socket) this.#receive(event.data);
    };
    socket.onclose = () => {
      if (socket === this.#socket) this.#dropped();
      else if (this.#state === "closed") this.#settleCloseWaiters();
    };
  }

  #receive(data: unknown): void {
    let bytes: Uint8Array;
    if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
    else if (ArrayBuffer.isView(data)) bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    else return this.emit("violation", { description: `a non-binary WebSocket message (${typeof data})` });
    let message: ServerMessage;
    try {
      message = decodeServerMessage(bytes);
    } catch (error) {
      return this.emit("violation", { description: `an undecodable ServerMessage of ${bytes.length} bytes: ${String(error)}` });
    }
    this.#handle(message);
  }

  #handle(message: ServerMessage): void {
    const kind = message.kind;
    switch (kind.case) {
      case "loginOk": {
        const login = this.#login;
        if (this.#state !== "loggingIn" || login === undefined) {
          return this.emit("violation", { description: `LoginOk while ${this.#state}`, message });
        }
        this.#login = undefined;
        const info: LoginInfo = {
          playerId: kind.value.playerId,
          name: login.name,
          position: toPoint(kind.value.position),
          mapWidth: kind.value.mapWidth,
          mapHeight: kind.value.mapHeight,
          viewRange: kind.value.viewRange,
          resumeToken: kind.value.resumeToken,
        };
        this.#info = info;
        this.#state = "playing";
        this.view.start(info);
        this.#armKeepAlive();
        return login.resolve(info);
      }
      case "viewReset": {
        if (this.#info !== undefined && kind.value.resumeToken.length > 0) {
          // A resume (or a restore after a shard failure) spends the token held: the fresh
          // one comes with the ViewReset, and only it works next time.
          this.#info = { ...this.#info, resumeToken: kind.value.resumeToken };
        }
        if (this.#state === "resuming" && this.#resumeAttempt !== undefined) {
          const attempt = this.#resumeAttempt;
          this.#state = "playing";
          this.view.apply(message);
          this.#armKeepAlive();
          attempt.settle({ kind: "resumed" });
          return this.emit("resumed", { position: toPoint(kind.value.position), attempts: attempt.attempts, url: this.currentUrl });
        }
        if (this.#state !== "playing") {
          return this.emit("violation", { description: `ViewReset while ${this.#state}`, message });
        }
        // The shard was restored under us: nothing still pending was applied.
        this.#answers.rejectAll("not applied: the view was reset");
        return this.view.apply(message);
      }
      case "moved": {
        // The view first, so that a move's promise resolves with `view.self` already moved.
        this.view.apply(message);
        const clientTime = kind.value.clientTime;
        if (clientTime === 0n) return;
        if (kind.value.playerId !== this.#info?.playerId) {
          return this.emit("violation", { description: `a move ack for another entity (${kind.value.playerId})`, message });
        }
        return this.#reportOutcome(this.#answers.onMoveAck(clientTime, toPoint(kind.value.position)), message);
      }
      case "actionDone":
        return this.#reportOutcome(this.#answers.onActionDone(kind.value.clientTime, kind.value.payload), message);
      case "pong": {
        const sentAt = this.#pings.get(kind.value.clientTime);
        if (sentAt === undefined) return;
        this.#pings.delete(kind.value.clientTime);
        return this.emit("pong", { clientTime: kind.value.clientTime, roundTripMs: Date.now() - sentAt });
      }
      case "error":
        return this.#handleError(new MeridianError(kind.value.code, kind.value.detail, kind.value.clientTime), message);
      case undefined:
        return this.emit("violation", { description: "a ServerMessage with no kind (or one this SDK does not know)", message });
      default:
        return this.view.apply(message);
    }
  }

  #handleError(error: MeridianError, message: ServerMessage): void {
    if (error.code === ErrorCode.REPLACED) this.#fatal = error;
    // Not fatal: the player is parked for the resume window, and another gateway takes the Resume.
    if (error.code === ErrorCode.SHUTTING_DOWN && this.#state === "playing") this.#shuttingDown = error;
    if (error.clientTime !== 0n) {
      if (this.#pings.delete(error.clientTime)) return this.emit("error", error);
      const outcome = this.#answers.onError(error);
      if (outcome.violation !== undefined) this.emit("violation", { description: outcome.violation, message });
      if (!outcome.matched) this.emit("error", error);
      return;
    }
    if (this.#state === "loggingIn" && this.#login !== undefined) {
      // The answer to the Login: the connection stays open for another try.
      const login = this.#login;
      this.#login = undefined;
      this.#state = "open";
      return login.reject(error);
    }
    if (this.#state === "resuming" && this.#resumeAttempt !== undefined) {
      const outcome: AttemptOutcome = error.code === ErrorCode.REPLACED ? { kind: "fatal", error } : { kind: "retry", error };
      this.#resumeAttempt.settle(outcome);
      return;
    }
    this.emit("error", error);
  }

  #reportOutcome(outcome: { violation?: string }, message: ServerMessage): void {
    if (outcome.violation !== undefined) this.emit("violation", { description: outcome.violation, message });
  }

  #armKeepAlive(): void {
    clearTimeout(this.#keepAliveTimer);
    if (this.#state !== "playing") return;
    const due = Math.max(0, this.#lastSentAt + this.#keepAliveMs - Date.now());
    this.#keepAliveTimer = setTimeout(() => {
      if (this.#state !== "playing") return;
      if (Date.now() - this.#lastSentAt >= this.#keepAliveMs) {
        const clientTime = this.#answers.nextClientTime();
        this.#transmit(this.#encode({ kind: { case: "ping", value: { clientTime } } }));
        this.#pings.set(clientTime, Date.now());
      }
      this.#armKeepAlive();
    }, due);
  }

  /** The socket in use closed, from the other side or the network. */
  #dropped(): void {
    this.#socket = undefined;
    clearTimeout(this.#keepAliveTimer);
    switch (this.#state) {
      case "closed":
        return this.#settleCloseWaiters();
      case "open":
      case "loggingIn": {
        const error = new MeridianError(ErrorCode.UNAVAILABLE, "the connection closed before LoginOk", 0n, true);
        this.#login?.reject(error);
        this.#login = undefined;
        return this.#finish("dropped", error);
      }
      case "playing":
        if (this.#fatal !== undefined) {
          this.#answers.rejectAll(`the connection was closed: ${this.#fatal.codeName}`);
          return this.#finish("replaced", this.#fatal);
        }
        if (this.#shuttingDown !== undefined) {
          this.#shuttingDown = undefined;
          return this.#startResume("the gateway is shutting down");
        }
        return this.#startResume("the connection dropped");
      case "resuming":
        // The attempt's socket closed before ViewReset: try again.
        return this.#resumeAttempt?.settle({ kind: "retry" });
    }
  }

  #startResume(reason: string): void {
    this.#state = "resuming";
    this.#pings.clear();
    this.#answers.rejectAll("the connection dropped before the answer: it may or may not have been applied");
    this.emit("resuming", { reason });
    void this.#resumeLoop();
  }

  /**
   * Tries `Resume` until one is accepted or the window ends. The first attempt is made at
   * once (a drop, or a gateway shutting down, is no reason to wait), each later one after a
   * growing, jittered wait. Each attempt goes to the next address after the one that failed,
   * round-robin: with more than one, the first never goes back to the gateway that just
   * closed or said `SHUTTING_DOWN`.
   */
  async #resumeLoop(): Promise<void> {
    const deadline = Date.now() + this.#resumeWindowMs;
    let delay = this.#reconnectDelayMs;
    let lastError: MeridianError | undefined;
    for (let attempts = 1; this.#state === "resuming" && Date.now() < deadline; attempts++) {
      this.#urlIndex = (this.#urlIndex + 1) % this.#urls.length;
      const outcome = await this.#attemptResume(deadline, attempts);
      if (this.#state !== "resuming" || outcome.kind === "resumed") return;
      if (outcome.kind === "fatal") {
        return this.#finish("replaced", outcome.error);
      }
      lastError = outcome.error ?? lastError;
      // Half fixed, half random: clients dropped together do not come back together.
      const wait = Math.min(delay * (0.5 + 0.5 * this.#random()), deadline - Date.now());
      if (wait > 0) await this.#sleep(wait);
      delay = Math.min(delay * 2, this.#reconnectMaxDelayMs);
    }
    if (this.#state === "resuming") {
      this.#finish(
        "resume-failed",
        lastError ?? new MeridianError(ErrorCode.UNAVAILABLE, "could not resume within the resume window", 0n, true),
      );
    }
  }

  async #attemptResume(deadline: number, attempts: number): Promise<AttemptOutcome> {
    const token = this.#info?.resumeToken;
    if (token === undefined) {
      return { kind: "fatal", error: new MeridianError(ErrorCode.INVALID_TOKEN, "no resume token", 0n, true) };
    }
    let socket: WebSocketLike;
    try {
      socket = await this.#open(this.currentUrl, Math.max(1, Math.min(this.#openTimeoutMs, deadline - Date.now())));
    } catch (error) {
      return { kind: "retry", error: error instanceof MeridianError ? error : undefined };
    }
    if (this.#state !== "resuming") {
      closeQuietly(socket);
      return { kind: "retry" };
    }
    return new Promise<AttemptOutcome>((resolve) => {
      const timer = setTimeout(
        () => settle({ kind: "retry", error: new MeridianError(ErrorCode.UNAVAILABLE, "no ViewReset before the resume window ended", 0n, true) }),
        Math.max(0, deadline - Date.now()),
      );
      const settle = (outcome: AttemptOutcome): void => {
        if (this.#resumeAttempt?.settle !== settle) return;
        clearTimeout(timer);
        this.#resumeAttempt = undefined;
        if (outcome.kind !== "resumed" && this.#socket === socket) {
          this.#socket = undefined;
          closeQuietly(socket);
        }
        resolve(outcome);
      };
      this.#resumeAttempt = { settle, attempts };
      this.#use(socket);
      this.#transmit(this.#encode({ kind: { case: "resume", value: { token } } }));
    });
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
    });
  }

  #shutDown(reason: CloseReason, pendingDetail: string): Promise<void> {
    if (this.#state === "closed") return Promise.resolve();
    const socket = this.#socket;
    const closedSocket = new Promise<void>((resolve) => {
      if (socket === undefined) resolve();
      else this.#closeWaiters.push(resolve);
    });
    this.#login?.reject(new MeridianError(ErrorCode.UNAVAILABLE, pendingDetail, 0n, true));
    this.#login = undefined;
    this.#answers.rejectAll(pendingDetail);
    this.#finish(reason);
    if (socket !== undefined) closeQuietly(socket, 1000);
    return closedSocket;
  }

  /** Enters `closed` for good and says why. */
  #finish(reason: CloseReason, error?: MeridianError): void {
    this.#state = "closed";
    clearTimeout(this.#keepAliveTimer);
    this.#pings.clear();
    this.#answers.rejectAll("the connection is closed");
    this.#shuttingDown = undefined;
    this.#resumeAttempt?.settle({ kind: "retry" });
    this.#wake?.();
    this.emit("closed", error === undefined ? { reason } : { reason, error });
  }

  #settleCloseWaiters(): void {
    const waiters = this.#closeWaiters;
    this.#closeWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

function closeQuietly(socket: WebSocketLike, code?: number): void {
  try {
    socket.close(code);
  } catch {
    // Closing a socket that is not open yet may throw in some implementations; it is going away either way.
  }
}
