/**
 * The gateway's `/play` page: log in over WebSocket, walk with the arrow keys or WASD, chat,
 * and see everyone in sight (players and a game's NPCs, with their health when the game
 * publishes `{"hp":H,"max":M}` as public state). In the example game, wolves, attack the
 * nearest wolf (F or Space; the one ringed) or a clicked one, summon a wolf (E), and read
 * the answers and the game's events as words on the log (`words.ts`). Bundled by esbuild
 * (`npm run bundle:play`) into `services/gateway/src/play.js`, which the gateway serves
 * inside `play.html`: the page loads nothing else at run time.
 *
 * For tests and curious players, `window.meridian` holds the connection and a summary of
 * what the page shows.
 */
import { Connection, MeridianError, PLAYER_KIND, type DirectionName, type Entity, type Point } from "../src/index.js";
import {
  ATTACK,
  SUMMON,
  attackWords,
  entityAt,
  eventWords,
  health,
  nearestWolf,
  summonPayload,
  summonWords,
  type Facing,
} from "./words.js";

declare global {
  interface Window {
    meridian?: {
      connection: Connection;
      status: () => string;
      seen: () => { id: string; name: string; x: number; y: number; kind: number; hp?: number }[];
      /** Every line of the log, oldest first: chat, the game's answers and events, errors. */
      log: string[];
      me: () => { id: string; x: number; y: number } | undefined;
      /** Where the centre of the cell `(x, y)` is on the page, in CSS pixels (for clicks). */
      onScreen: (x: number, y: number) => { x: number; y: number } | undefined;
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

function setStatus(text: string, kind: "ok" | "warn" | "bad") {
  const line = byId<HTMLDivElement>("status");
  line.textContent = text;
  line.className = kind;
}

/** The cell at the canvas's top left corner, while the player is in the world. */
function corner(connection: Connection): Point | undefined {
  const me = connection.view.self;
  const world = connection.view.world;
  if (!me || !world) return undefined;
  return { x: me.position.x - world.viewRange, y: me.position.y - world.viewRange };
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
  // The wolf the attack key hits.
  const target = nearestWolf(me.position, view.entities.values());
  if (target) {
    ctx.strokeStyle = "#ffd54f";
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.arc((target.position.x - left) * CELL + CELL / 2, (target.position.y - top) * CELL + CELL / 2, CELL / 2 + 1, 0, Math.PI * 2);
    ctx.stroke();
  }
  byId<HTMLSpanElement>("where").textContent = `(${me.position.x}, ${me.position.y})`;
  const own = health(me.state);
  byId<HTMLSpanElement>("hp").textContent = own ? `health ${own.hp}/${own.max}` : "";
}

/** A line on the log: `chat` (what players say), `game` (answers and events) or `bad`. */
function say(line: string, lines: string[], kind: "chat" | "game" | "bad" = "bad") {
  lines.push(line);
  const log = byId<HTMLDivElement>("chat-log");
  const entry = document.createElement("div");
  entry.textContent = line;
  entry.className = kind;
  log.appendChild(entry);
  log.scrollTop = log.scrollHeight;
}

/** How many names of entities gone from sight the page remembers (for events that name them). */
const NAMES_KEPT = 256;

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
/** The wolves game's action keys (listed on the page, `play.html`). */
const ATTACK_KEYS = new Set(["f", " "]);
const SUMMON_KEYS = new Set(["e"]);

async function play(name: string, spawn: { x: number; y: number } | undefined) {
  setStatus("connecting...", "warn");
  const connection = await Connection.connect(websocketUrl());
  const lines: string[] = [];
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
    log: lines,
    me: () => {
      const me = connection.view.self;
      return me ? { id: me.id.toString(), x: me.position.x, y: me.position.y } : undefined;
    },
    onScreen: (x, y) => {
      const at = corner(connection);
      if (!at) return undefined;
      const canvas = byId<HTMLCanvasElement>("world");
      const box = canvas.getBoundingClientRect();
      const scale = canvas.clientWidth / canvas.width;
      return {
        x: box.left + canvas.clientLeft + (x - at.x + 0.5) * CELL * scale,
        y: box.top + canvas.clientTop + (y - at.y + 0.5) * CELL * scale,
      };
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
  // The names of entities that left sight: a wolf's DIED may come after its Left.
  const gone = new Map<bigint, string>();
  connection.view.on("left", (entity) => {
    gone.set(entity.id, entity.name);
    if (gone.size > NAMES_KEPT) gone.delete(gone.keys().next().value as bigint);
  });
  const nameOf = (id: bigint) => connection.view.get(id)?.name ?? gone.get(id);
  connection.view.on("chat", ({ sender, text }) => say(`${sender?.name ?? "someone"}: ${text}`, lines, "chat"));
  connection.view.on("event", (event) => say(eventWords(event, connection.view.self?.id, nameOf), lines, "game"));
  connection.on("resuming", () => setStatus("connection lost: resuming...", "warn"));
  connection.on("resumed", () => setStatus("playing (resumed)", "ok"));
  connection.on("closed", ({ reason }) => setStatus(`closed: ${reason}`, "bad"));
  connection.on("error", (error) => say(`! ${error.codeName}: ${error.detail}`, lines));
  await connection.login(name, spawn ? { spawn } : {});
  setStatus("playing", "ok");
  byId<HTMLFormElement>("login").hidden = true;
  byId<HTMLDivElement>("game").hidden = false;
  byId<HTMLDivElement>("controls").hidden = false;
  // The name box is hidden now: keys go to the game.
  (document.activeElement as HTMLElement | null)?.blur();
  redraw();

  /** An answer to a move or action that is not the game's: shown, unless the SDK made it. */
  const failed = (what: string) => (error: unknown) => {
    if (!(error instanceof MeridianError)) return;
    if (what === "move" && error.codeName === "UNAVAILABLE" && connection.state === "playing") {
      // The player's shard failed: the gateway brings the player back elsewhere and
      // says so with a ViewReset; meanwhile moves are refused. (An action's UNAVAILABLE
      // may only say that a neighbour shard owning its target did not answer in time.)
      restoring = true;
      setStatus("shard unavailable: resuming...", "warn");
    } else if (error.codeName === "REJECTED") {
      say(`${what} refused: ${error.detail}`, lines, "game");
    } else if (!error.local) {
      say(`! ${error.codeName}: ${error.detail}`, lines);
    }
  };
  const attack = (target: Entity | undefined) => {
    if (!target) {
      say("no wolf in sight to attack", lines, "game");
      return;
    }
    connection.action(ATTACK, { target: target.id }).then(
      (payload) => say(attackWords(payload, target), lines, "game"),
      failed("attack"),
    );
  };
  let facing: Facing = "right";
  const summon = () => {
    connection.action(SUMMON, { payload: summonPayload(facing) }).then(
      (payload) => say(summonWords(payload), lines, "game"),
      failed("summon"),
    );
  };
  const attackNearest = () => {
    const me = connection.view.self;
    attack(me && nearestWolf(me.position, connection.view.entities.values()));
  };

  document.addEventListener("keydown", (event) => {
    const chatBox = byId<HTMLInputElement>("chat-text");
    if (event.target === chatBox && event.key === "Escape") {
      chatBox.blur();
      return;
    }
    if ((event.target as HTMLElement).tagName === "INPUT") return;
    // Leave the browser's own shortcuts (Ctrl+F, Cmd+W...) alone.
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    if (key === "Enter") {
      event.preventDefault();
      chatBox.focus();
      return;
    }
    if (ATTACK_KEYS.has(key) || SUMMON_KEYS.has(key)) {
      event.preventDefault();
      // A held key repeats about 30 times a second, past the gateway's action limit.
      if (event.repeat) return;
      if (ATTACK_KEYS.has(key)) attackNearest();
      else summon();
      return;
    }
    const direction = KEYS[key];
    if (!direction) return;
    event.preventDefault();
    facing = direction;
    connection.move(direction).then(() => {
      if (restoring) {
        restoring = false;
        setStatus("playing", "ok");
      }
      redraw();
    }, failed("move"));
  });
  byId<HTMLCanvasElement>("world").addEventListener("click", (event) => {
    const at = corner(connection);
    if (!at) return;
    const canvas = event.currentTarget as HTMLCanvasElement;
    const box = canvas.getBoundingClientRect();
    // Inside the border; the canvas may be drawn at another size than its own pixels.
    const scale = canvas.width / canvas.clientWidth;
    const column = Math.floor(((event.clientX - box.left - canvas.clientLeft) * scale) / CELL);
    const row = Math.floor(((event.clientY - box.top - canvas.clientTop) * scale) / CELL);
    const cell = { x: at.x + column, y: at.y + row };
    const target = entityAt(cell, connection.view.entities.values());
    if (target) attack(target);
    else say(`nothing to attack at (${cell.x}, ${cell.y})`, lines, "game");
  });
  for (const [id, act] of [
    ["attack", attackNearest],
    ["summon", summon],
  ] as const) {
    const button = byId<HTMLButtonElement>(id);
    // A button keeps no focus, so Space and Enter stay the game's keys.
    button.addEventListener("mousedown", (event) => event.preventDefault());
    button.addEventListener("click", () => act());
  }
  byId<HTMLFormElement>("chat").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = byId<HTMLInputElement>("chat-text");
    const text = input.value.trim();
    if (!text) return;
    try {
      connection.chat(text);
      input.value = "";
    } catch (error) {
      say(`! ${(error as Error).message}`, lines);
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
