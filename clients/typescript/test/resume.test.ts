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
/** The gateways of the tests with more than one, stopped after each. */
let cluster: FakeGateway[] = [];

afterEach(async () => {
  await gateway?.stop();
  gateway = undefined;
  await Promise.all(cluster.map((g) => g.stop()));
  cluster = [];
});

/** Starts gateways that share one handler, so one player (and its token) is known to all, as on a cluster. */
async function startCluster(count: number, handler: (socket: ServerSocket, message: ClientMessage) => void): Promise<FakeGateway[]> {
  for (let i = 0; i < count; i++) cluster.push(await FakeGateway.start(handler));
  return cluster;
}

const shuttingDown = { kind: { case: "error", value: { code: ErrorCode.SHUTTING_DOWN, detail: "gateway is shutting down" } } } as const;

/**
 * Logs in on the first connection, and accepts `Resume` with the right token on later ones.
 * A token is good once, as on a real cluster: each accepted resume's ViewReset brings the
 * next one.
 */
function playingGateway(options: { refuseResumes?: number; answerMoves?: boolean } = {}): (socket: ServerSocket, message: ClientMessage) => void {
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
        // Unless asked to answer, never answered: the connection is dropped under it.
        if (!options.answerMoves) return;
        return send(socket, { kind: { case: "moved", value: { playerId: 7n, position: { x: 10, y: 20 }, clientTime: message.kind.value.clientTime } } });
      default:
        return;
    }
  };
}

/** `record`, with the `error` events too. */
function recordWithErrors(connection: Connection): string[] {
  const events = record(connection);
  connection.on("error", (error) => events.push(`error ${error.codeName}`));
  return events;
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

describe("Connection: resuming on another gateway", () => {
  it("after SHUTTING_DOWN, resumes at once on the next gateway with the same token, and plays on there", async () => {
    const [a, b] = await startCluster(2, playingGateway({ answerMoves: true }));
    // A first attempt that waited for the backoff would take at least 500 ms.
    const connection = await Connection.connect(a!.url, { ...fast, reconnectDelayMs: 1_000, reconnectMaxDelayMs: 1_000, gateways: [b!.url] });
    const events = recordWithErrors(connection);
    const resumed: ConnectionEvents["resumed"][] = [];
    connection.on("resumed", (event) => resumed.push(event));
    let shutdown: MeridianError | undefined;
    connection.on("error", (error) => (shutdown = error));
    await connection.login("ada");
    expect(connection.currentUrl).toBe(a!.url);

    const started = Date.now();
    send(a!.connections[0]!, shuttingDown);
    a!.connections[0]!.close(1001);
    await waitFor(() => connection.state === "playing" && connection.view.entities.size === 1, "the connection to resume on the second gateway");
    expect(Date.now() - started).toBeLessThan(400);

    expect(events).toEqual(["error SHUTTING_DOWN", "resuming: the gateway is shutting down", "view reset at 10,21", "resumed at 10,21", "entered bob"]);
    expect(shutdown?.closesConnection).toBe(true);
    expect(a!.connections.length).toBe(1);
    expect(b!.connections.length).toBe(1);
    const resume = b!.received.find((r) => r.message.kind.case === "resume");
    expect(resume?.message.kind.case === "resume" && [...resume.message.kind.value.token]).toEqual([...TOKEN]);
    expect(resumed).toEqual([{ position: { x: 10, y: 21 }, attempts: 1, url: b!.url }]);
    expect(connection.currentUrl).toBe(b!.url);
    expect(connection.url).toBe(a!.url);

    // The second gateway's socket is the one used from now on, and answers.
    await expect(connection.move("up")).resolves.toEqual({ x: 10, y: 20 });
    expect(b!.received.filter((r) => r.message.kind.case === "move").map((r) => r.socket)).toEqual([b!.connections[0]]);
    await connection.close();
  });

  it("after a drop, tries the next address, duplicates in the list left out", async () => {
    const [a, b] = await startCluster(2, playingGateway());
    const connection = await Connection.connect(a!.url, { ...fast, gateways: [a!.url, b!.url, b!.url] });
    const resumed: ConnectionEvents["resumed"][] = [];
    connection.on("resumed", (event) => resumed.push(event));
    await connection.login("ada");
    a!.connections[0]!.terminate();
    await waitFor(() => connection.state === "playing" && resumed.length === 1, "the connection to resume on the second gateway");
    expect(resumed[0]).toMatchObject({ attempts: 1, url: b!.url });
    expect(a!.connections.length).toBe(1);
    const resume = b!.received.find((r) => r.message.kind.case === "resume");
    expect(resume?.message.kind.case === "resume" && [...resume.message.kind.value.token]).toEqual([...TOKEN]);
    expect(connection.currentUrl).toBe(b!.url);

    // A drop on the second goes back to the first: two addresses, in turn.
    b!.connections[0]!.terminate();
    await waitFor(() => resumed.length === 2, "the connection to resume on the first gateway again");
    expect(resumed[1]).toMatchObject({ attempts: 1, url: a!.url });
    expect(a!.connections.length).toBe(2);
    expect(connection.currentUrl).toBe(a!.url);
    await connection.close();
  });

  it("goes round the addresses in turn while some are away, back to the one that failed", async () => {
    const [a, b, c] = await startCluster(3, playingGateway());
    const order: string[] = [];
    for (const [name, g] of [["a", a!], ["b", b!], ["c", c!]] as const) g.server.on("connection", () => order.push(name));
    const connection = await Connection.connect(a!.url, { ...fast, gateways: [b!.url, c!.url] });
    const resumed: ConnectionEvents["resumed"][] = [];
    connection.on("resumed", (event) => resumed.push(event));
    await connection.login("ada");
    // b and c refuse everyone at the door.
    b!.server.on("connection", (socket) => socket.terminate());
    c!.server.on("connection", (socket) => socket.terminate());
    a!.connections[0]!.terminate();
    await waitFor(() => connection.state === "playing" && resumed.length === 1, "the connection to resume on the first gateway");
    expect(order).toEqual(["a", "b", "c", "a"]);
    expect(resumed).toEqual([{ position: { x: 10, y: 21 }, attempts: 3, url: a!.url }]);
    await connection.close();
  });

  it("with one address, SHUTTING_DOWN resumes on that address, as a drop does", async () => {
    gateway = await FakeGateway.start(playingGateway());
    const connection = await Connection.connect(gateway.url, fast);
    const events = recordWithErrors(connection);
    const resumed: ConnectionEvents["resumed"][] = [];
    connection.on("resumed", (event) => resumed.push(event));
    await connection.login("ada");
    send(gateway.connections[0]!, shuttingDown);
    gateway.connections[0]!.close(1001);
    await waitFor(() => connection.state === "playing" && connection.view.entities.size === 1, "the connection to resume");
    expect(events).toEqual(["error SHUTTING_DOWN", "resuming: the gateway is shutting down", "view reset at 10,21", "resumed at 10,21", "entered bob"]);
    expect(gateway.connections.length).toBe(2);
    expect(resumed).toEqual([{ position: { x: 10, y: 21 }, attempts: 1, url: gateway.url }]);
    expect(connection.currentUrl).toBe(gateway.url);
    await connection.close();
  });

  it("does not resume after REPLACED, other gateways listed or not", async () => {
    const [a, b] = await startCluster(2, playingGateway());
    const connection = await Connection.connect(a!.url, { ...fast, gateways: [b!.url] });
    const events = recordWithErrors(connection);
    await connection.login("ada");
    send(a!.connections[0]!, { kind: { case: "error", value: { code: ErrorCode.REPLACED, detail: "another login took over" } } });
    a!.connections[0]!.close(1000);
    await waitFor(() => connection.state === "closed", "the connection to close");
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(events).toEqual(["error REPLACED", "closed replaced REPLACED"]);
    expect(a!.connections.length).toBe(1);
    expect(b!.connections.length).toBe(0);
  });
});
