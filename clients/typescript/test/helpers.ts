/** Test doubles: an in-memory WebSocket, a fake gateway over `ws` on loopback, and message builders. */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { WebSocketServer, type WebSocket as ServerSocket } from "ws";
import type { AddressInfo } from "node:net";
import { ClientMessageSchema, ServerMessageSchema, type ClientMessage, type ServerMessage } from "../src/index.js";
import type { WebSocketLike } from "../src/index.js";

export type ServerMessageInit = MessageInitShape<typeof ServerMessageSchema>;

export function serverBytes(message: ServerMessageInit): Uint8Array {
  return toBinary(ServerMessageSchema, create(ServerMessageSchema, message));
}

export function serverMessage(message: ServerMessageInit): ServerMessage {
  return create(ServerMessageSchema, message);
}

export function decodeClient(bytes: Uint8Array): ClientMessage {
  return fromBinary(ClientMessageSchema, bytes);
}

export const TOKEN = new Uint8Array([1, 2, 3, 4]);

export function loginOk(playerId = 7n, x = 10, y = 20): ServerMessageInit {
  return {
    kind: {
      case: "loginOk",
      value: { playerId, position: { x, y }, resumeToken: TOKEN, mapWidth: 1000, mapHeight: 500, viewRange: 16 },
    },
  };
}

/**
 * An in-memory WebSocket: the test plays the server. Every instance made is kept in
 * `FakeSocket.made`, so a test can reach the one the connection opened.
 */
export class FakeSocket implements WebSocketLike {
  static made: FakeSocket[] = [];
  binaryType = "blob";
  readyState = 0;
  onopen: ((event: unknown) => void) | null = null;
  onmessage: ((event: { data: unknown }) => void) | null = null;
  onclose: ((event: { code: number; reason: string }) => void) | null = null;
  onerror: ((event: unknown) => void) | null = null;
  readonly sent: ClientMessage[] = [];

  constructor(readonly url: string) {
    FakeSocket.made.push(this);
    // Opens on the next task, as a real one would.
    queueMicrotask(() => {
      if (this.readyState !== 0) return;
      this.readyState = 1;
      this.onopen?.({});
    });
  }

  static last(): FakeSocket {
    const socket = FakeSocket.made.at(-1);
    if (socket === undefined) throw new Error("expected a FakeSocket to have been made");
    return socket;
  }

  send(data: Uint8Array): void {
    if (this.readyState !== 1) throw new Error("send on a FakeSocket that is not open");
    this.sent.push(decodeClient(data));
  }

  close(code = 1005): void {
    this.serverClose(code);
  }

  /** The server sends one message, as an ArrayBuffer (binaryType "arraybuffer"). */
  deliver(message: ServerMessageInit): void {
    const bytes = serverBytes(message);
    this.onmessage?.({ data: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) });
  }

  /** The other side (or the network) closes the connection. */
  serverClose(code = 1006): void {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason: "" });
  }

  sentKinds(): (string | undefined)[] {
    return this.sent.map((message) => message.kind.case);
  }
}

/**
 * A fake gateway on an ephemeral loopback port, speaking the protocol as the test scripts it:
 * `onMessage` sees each decoded ClientMessage with the socket it came on.
 */
export class FakeGateway {
  readonly connections: ServerSocket[] = [];
  readonly received: { socket: ServerSocket; message: ClientMessage }[] = [];

  private constructor(
    readonly server: WebSocketServer,
    readonly url: string,
    public onMessage: (socket: ServerSocket, message: ClientMessage) => void,
  ) {
    server.on("connection", (socket) => {
      this.connections.push(socket);
      socket.on("message", (data, isBinary) => {
        if (!isBinary) throw new Error("the client sent a text WebSocket message");
        const message = decodeClient(new Uint8Array(data as Buffer));
        this.received.push({ socket, message });
        this.onMessage(socket, message);
      });
    });
  }

  static async start(onMessage: (socket: ServerSocket, message: ClientMessage) => void): Promise<FakeGateway> {
    const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    await new Promise<void>((resolve, reject) => {
      server.once("listening", resolve);
      server.once("error", reject);
    });
    const { port } = server.address() as AddressInfo;
    return new FakeGateway(server, `ws://127.0.0.1:${port}/play`, onMessage);
  }

  static send(socket: ServerSocket, message: ServerMessageInit): void {
    socket.send(serverBytes(message), { binary: true });
  }

  async stop(): Promise<void> {
    for (const socket of this.server.clients) socket.terminate();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** Waits for `condition` with a deadline, and says what was expected if it never holds. */
export async function waitFor(condition: () => boolean, expected: string, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${expected}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Lets promise callbacks and queued microtasks run. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}
