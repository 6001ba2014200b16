/**
 * Auto-resume against a fake gateway: a real `ws` WebSocketServer on an ephemeral loopback
 * port, speaking the protocol as each test scripts it. The connection uses `ws`'s client,
 * as it would on Node 20.
 */
import { afterEach, describe, expect, it } from "vitest";
import { WebSocket, type WebSocket as ServerSocket } from "ws";
import { Connection, ErrorCode, type ClientMessage, type ConnectionEvents, type MeridianError } from "../src/index.js";
import { FakeGateway, loginOk, TOKEN, waitFor } from "./helpers.js";

const send = FakeGateway.send;
let gateway: FakeGateway | undefined;

afterEach(async () => {
  await gateway?.stop();
  gateway = undefined;
});

/**
 * Logs in on the first connection, and accepts `Resume` with the right token on later ones.
 * A token is good once, as on a real cluster: each accepted resume's ViewReset brings the
 * next one.
 */
function playingGateway(options: { refuseResumes?: number } = {}): (socket: ServerSocket, message: ClientMessage) => void {
  let refused = 0;
  let valid = TOKEN;
  let issued = 0;
  return (socket, message) => {
    switch (message.kind.case) {
      case "login":
        return send(socket, loginOk(7n, 10, 20));
      case "resume":
        if (Buffer.compare(Buffer.from(message.kind.value.token), Buffer.from(valid)) !== 0) {
          return send(socket, { kind: { case: "error", value: { code: ErrorCode.INVALID_TOKEN, detail: "bad token" } } });
        }
        if (refused < (options.refuseResumes ?? 0)) {
          refused += 1;
          // As a gateway whose shards have not answered yet: refused, connection left open.
          return send(socket, { kind: { case: "error", value: { code: ErrorCode.INVALID_TOKEN, detail: "no shard answered the resume" } } });
        }
        issued += 1;
        valid = new Uint8Array([9, 9, issued]);
        send(socket, { kind: { case: "viewReset", value: { playerId: 7n, position: { x: 10, y: 21 }, resumeToken: valid } } });
        return send(socket, { kind: { case: "entered", value: { playerId: 2n, name: "bob", position: { x: 11, y: 21 } } } });
      case "move":
        // Never answered: the connection is dropped under it.
        return;
      default:
        return;
    }
  };
}

function record(connection: Connection): string[] {
  const events: string[] = [];
  connection.on("resuming", ({ reason }) => events.push(`resuming: ${reason}`));
  connection.on("resumed", ({ position }) => events.push(`resumed at ${position.x},${position.y}`));
  connection.on("closed", ({ reason, error }: ConnectionEvents["closed"]) => events.push(`closed ${reason}${error ? ` ${error.codeName}` : ""}`));
  connection.view.on("reset", ({ position }) => events.push(`view reset at ${position.x},${position.y}`));
  connection.view.on("entered", (e) => events.push(`entered ${e.name}`));
  return events;
}

const fast = { WebSocket, reconnectDelayMs: 10, reconnectMaxDelayMs: 50 } as const;

describe("Connection: auto-resume", () => {
  it("reconnects after a drop, sends Resume with its token, and carries on after ViewReset", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, fast);
    const events = record(connection);
    await connection.login("ada");
    const pending = connection.move("up");
    await waitFor(() => gateway!.received.some((r) => r.message.kind.case === "move"), "the server to receive the move");

    gateway.connections[0]!.terminate();
    const error = (await pending.catch((e: MeridianError) => e)) as MeridianError;
    expect(error.code).toBe(ErrorCode.UNAVAILABLE);
    expect(error.detail).toMatch(/dropped before the answer/);

    await waitFor(() => connection.state === "playing" && connection.view.entities.size === 1, "the connection to resume and see bob");
    expect(gateway.connections.length).toBe(2);
    const resume = gateway.received.find((r) => r.message.kind.case === "resume");
    expect(resume?.socket).toBe(gateway.connections[1]);
    expect(resume?.message.kind.case === "resume" && [...resume.message.kind.value.token]).toEqual([...TOKEN]);
    expect(events).toEqual(["resuming: the connection dropped", "view reset at 10,21", "resumed at 10,21", "entered bob"]);
    expect(connection.view.self?.position).toEqual({ x: 10, y: 21 });

    // The new socket is the one used from now on.
    connection.chat("back");
    await waitFor(() => gateway!.received.some((r) => r.message.kind.case === "chat" && r.socket === gateway!.connections[1]), "chat on the new connection");
    await connection.close();
  });

  it("resumes again with the token the last ViewReset brought (a token is good once)", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, fast);
    const events = record(connection);
    await connection.login("ada");
    gateway.connections[0]!.terminate();
    await waitFor(() => events.filter((e) => e.startsWith("resumed")).length === 1, "the first resume");
    expect([...connection.info!.resumeToken]).toEqual([9, 9, 1]);
    gateway.connections[1]!.terminate();
    await waitFor(() => events.filter((e) => e.startsWith("resumed")).length === 2, "the second resume");
    const tokens = gateway.received.filter((r) => r.message.kind.case === "resume").map((r) => (r.message.kind.case === "resume" ? [...r.message.kind.value.token] : []));
    expect(tokens).toEqual([[...TOKEN], [9, 9, 1]]);
    await connection.close();
  });

  it("keeps trying while the gateway refuses or is away, within the window", async () => {
    gateway = await FakeGateway.start(playingGateway({ refuseResumes: 2 }));
    const connection = await Connection.connect(gateway.url, fast);
    const events = record(connection);
    await connection.login("ada");
    gateway.connections[0]!.close(1001);
    await waitFor(() => connection.state === "playing" && events.includes("resumed at 10,21"), "a resume after two refusals");
    expect(gateway.received.filter((r) => r.message.kind.case === "resume").length).toBe(3);
    await connection.close();
  });

  it("gives up with an event once the resume window has passed", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, { ...fast, resumeWindowMs: 300 });
    const events = record(connection);
    await connection.login("ada");
    // Every later connection is refused at the door.
    gateway.server.on("connection", (socket) => socket.terminate());
    const started = Date.now();
    gateway.connections[0]!.terminate();
    await waitFor(() => connection.state === "closed", "the connection to give up");
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(events[0]).toBe("resuming: the connection dropped");
    expect(events.at(-1)).toMatch(/^closed resume-failed/);
    expect(gateway.connections.length).toBeGreaterThan(2);
  });

  it("does not resume after REPLACED over a real socket", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, fast);
    const events = record(connection);
    await connection.login("ada");
    const first = gateway.connections[0]!;
    send(first, { kind: { case: "error", value: { code: ErrorCode.REPLACED, detail: "another login took over" } } });
    first.close(1000);
    await waitFor(() => connection.state === "closed", "the connection to close");
    // Give a wrong reconnection a chance to show itself.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(events).toEqual(["closed replaced REPLACED"]);
    expect(gateway.connections.length).toBe(1);
  });

  it("stops resuming when the app closes it", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, { ...fast, reconnectDelayMs: 1_000 });
    const events = record(connection);
    await connection.login("ada");
    gateway.server.on("connection", (socket) => socket.terminate());
    gateway.connections[0]!.terminate();
    await waitFor(() => gateway!.connections.length >= 2, "a first resume attempt");
    await connection.close();
    const attempts = gateway.connections.length;
    await new Promise((resolve) => setTimeout(resolve, 1_200));
    expect(gateway.connections.length).toBe(attempts);
    expect(events.filter((e) => e.startsWith("closed"))).toEqual(["closed closed"]);
  });
});
