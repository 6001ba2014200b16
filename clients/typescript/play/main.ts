/**
 * The gateway's `/play` page: log in over WebSocket, walk with the arrow keys or WASD, chat,
 * and see everyone in sight (players and a game's NPCs, with their health when the game
 * publishes `{"hp":H,"max":M}` as public state). Bundled by esbuild (`npm run bundle:play`)
 * into `services/gateway/src/play.js`, which the gateway serves inside `play.html`: the page
 * loads nothing else at run time.
 *
 * For tests and curious players, `window.meridian` holds the connection and a summary of
 * what the page shows.
 */
import { Connection, MeridianError, PLAYER_KIND, type DirectionName, type Entity } from "../src/index.js";

declare global {
  interface Window {
    meridian?: {
      connection: Connection;
      status: () => string;
      seen: () => { id: string; name: string; x: number; y: number; kind: number; hp?: number }[];
      chats: string[];
      me: () => { id: string; x: number; y: number } | undefined;
    };
    MERIDIAN_WS_PORT?: number;
  }
}

const CELL = 15;
const byId = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

/** Where the WebSocket front is: `?ws=URL`, else this host on the gateway's WebSocket port. */
function websocketUrl(): string {
  const asked = new URLSearchParams(location.search).get("ws");
  if (asked) return asked;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.hostname}:${window.MERIDIAN_WS_PORT ?? 7778}/`;
}

function health(state: Uint8Array): { hp: number; max: number } | undefined {
  try {
    const parsed = JSON.parse(new TextDecoder().decode(state)) as { hp?: unknown; max?: unknown };
    if (typeof parsed.hp === "number" && typeof parsed.max === "number" && parsed.max > 0) {
      return { hp: parsed.hp, max: parsed.max };
    }
  } catch {
    // Not JSON: a game with another state format.
  }
  return undefined;
}

function setStatus(text: string, kind: "ok" | "warn" | "bad") {
  const line = byId<HTMLDivElement>("status");
  line.textContent = text;
  line.className = kind;
}

function draw(connection: Connection) {
  const canvas = byId<HTMLCanvasElement>("world");
  const ctx = canvas.getContext("2d");
  const view = connection.view;
  const me = view.self;
  const world = view.world;
  if (!ctx || !me || !world) return;
  const side = world.viewRange * 2 + 1;
  if (canvas.width !== side * CELL) {
    canvas.width = side * CELL;
    canvas.height = side * CELL;
  }
  const left = me.position.x - world.viewRange;
  const top = me.position.y - world.viewRange;
  ctx.fillStyle = "#20242c";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  // The map's edge: cells outside it are darker.
  ctx.fillStyle = "#101216";
  for (let row = 0; row < side; row++) {
    for (let column = 0; column < side; column++) {
      const x = left + column;
      const y = top + row;
      if (x < 0 || y < 0 || x >= world.mapWidth || y >= world.mapHeight) {
        ctx.fillRect(column * CELL, row * CELL, CELL, CELL);
      }
    }
  }
  const drawEntity = (entity: Entity, colour: string) => {
    const cx = (entity.position.x - left) * CELL + CELL / 2;
    const cy = (entity.position.y - top) * CELL + CELL / 2;
    ctx.fillStyle = colour;
    ctx.beginPath();
    ctx.arc(cx, cy, CELL / 2 - 1, 0, Math.PI * 2);
    ctx.fill();
    ctx.fillStyle = "#e8e8e8";
    ctx.font = "10px sans-serif";
    ctx.textAlign = "center";
    ctx.fillText(entity.name, cx, cy - CELL / 2 - 4);
    const hp = health(entity.state);
    if (hp) {
      const width = CELL;
      ctx.fillStyle = "#5a1d1d";
      ctx.fillRect(cx - width / 2, cy + CELL / 2, width, 3);
      ctx.fillStyle = "#4caf50";
      ctx.fillRect(cx - width / 2, cy + CELL / 2, (width * Math.max(0, hp.hp)) / hp.max, 3);
    }
  };
  for (const entity of view.entities.values()) {
    drawEntity(entity, entity.kind === PLAYER_KIND ? "#4fc3f7" : "#ff7043");
  }
  drawEntity(me, "#ffd54f");
  byId<HTMLSpanElement>("where").textContent = `(${me.position.x}, ${me.position.y})`;
  const own = health(me.state);
  byId<HTMLSpanElement>("hp").textContent = own ? `health ${own.hp}/${own.max}` : "";
}

function say(line: string, chats: string[]) {
  chats.push(line);
  const log = byId<HTMLDivElement>("chat-log");
  const entry = document.createElement("div");
  entry.textContent = line;
  log.appendChild(entry);
  log.scrollTop = log.scrollHeight;
}

const KEYS: Record<string, DirectionName> = {
  ArrowUp: "up",
  ArrowDown: "down",
  ArrowLeft: "left",
  ArrowRight: "right",
  w: "up",
  s: "down",
  a: "left",
  d: "right",
};

async function play(name: string, spawn: { x: number; y: number } | undefined) {
  setStatus("connecting...", "warn");
  const connection = await Connection.connect(websocketUrl());
  const chats: string[] = [];
  window.meridian = {
    connection,
    status: () => byId<HTMLDivElement>("status").textContent ?? "",
    seen: () =>
      [...connection.view.entities.values()].map((e) => ({
        id: e.id.toString(),
        name: e.name,
        x: e.position.x,
        y: e.position.y,
        kind: e.kind,
        hp: health(e.state)?.hp,
      })),
    chats,
    me: () => {
      const me = connection.view.self;
      return me ? { id: me.id.toString(), x: me.position.x, y: me.position.y } : undefined;
    },
  };
  const redraw = () => draw(connection);
  let restoring = false;
  connection.view.on("reset", () => {
    if (restoring || connection.state === "playing") {
      restoring = false;
      setStatus("playing (resumed)", "ok");
    }
  });
  for (const event of ["entered", "moved", "left", "stateChanged", "reset"] as const) {
    connection.view.on(event, redraw);
  }
  connection.view.on("chat", ({ sender, text }) => say(`${sender?.name ?? "someone"}: ${text}`, chats));
  connection.view.on("event", ({ source, kind }) => {
    const from = connection.view.get(source)?.name ?? (source === 0n ? "the world" : `#${source}`);
    say(`* event ${kind} from ${from}`, chats);
  });
  connection.on("resuming", () => setStatus("connection lost: resuming...", "warn"));
  connection.on("resumed", () => setStatus("playing (resumed)", "ok"));
  connection.on("closed", ({ reason }) => setStatus(`closed: ${reason}`, "bad"));
  connection.on("error", (error) => say(`! ${error.codeName}: ${error.detail}`, chats));
  await connection.login(name, spawn ? { spawn } : {});
  setStatus("playing", "ok");
  byId<HTMLFormElement>("login").hidden = true;
  byId<HTMLDivElement>("game").hidden = false;
  redraw();
  document.addEventListener("keydown", (event) => {
    if ((event.target as HTMLElement).tagName === "INPUT") return;
    const direction = KEYS[event.key];
    if (!direction) return;
    event.preventDefault();
    connection.move(direction).then(
      () => {
        if (restoring) {
          restoring = false;
          setStatus("playing", "ok");
        }
        redraw();
      },
      (error: unknown) => {
        if (!(error instanceof MeridianError)) return;
        if (error.codeName === "UNAVAILABLE" && connection.state === "playing") {
          // The player's shard failed: the gateway brings the player back elsewhere and
          // says so with a ViewReset; meanwhile moves are refused.
          restoring = true;
          setStatus("shard unavailable: resuming...", "warn");
        } else if (!error.local) {
          say(`! ${error.codeName}: ${error.detail}`, chats);
        }
      },
    );
  });
  byId<HTMLFormElement>("chat").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = byId<HTMLInputElement>("chat-text");
    const text = input.value.trim();
    if (!text) return;
    try {
      connection.chat(text);
      input.value = "";
    } catch (error) {
      say(`! ${(error as Error).message}`, chats);
    }
  });
}

byId<HTMLFormElement>("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = byId<HTMLInputElement>("name").value.trim() || `guest-${Math.floor(Math.random() * 10000)}`;
  const x = Number.parseInt(byId<HTMLInputElement>("x").value, 10);
  const y = Number.parseInt(byId<HTMLInputElement>("y").value, 10);
  const spawn = Number.isFinite(x) && Number.isFinite(y) ? { x, y } : undefined;
  play(name, spawn).catch((error: unknown) => setStatus(`cannot play: ${(error as Error).message ?? error}`, "bad"));
});
// `?name=ann&x=10&y=20&auto=1` logs in at once (tests, links).
const query = new URLSearchParams(location.search);
for (const field of ["name", "x", "y"]) {
  const value = query.get(field);
  if (value !== null) byId<HTMLInputElement>(field).value = value;
}
if (query.get("auto") === "1") byId<HTMLFormElement>("login").requestSubmit();
