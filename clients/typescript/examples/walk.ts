// A bot that logs in, says hello, walks in a square and prints who it sees (the README's example).
// Run it with `npm run walk` (a `meridian up` cluster's WebSocket port, 7778) or
// `npm run walk -- ws://HOST:PORT/`: it bundles this file with esbuild, a dev dependency.
import { WebSocket } from "ws"; // Node 20 only: browsers and Node >= 22 have a global WebSocket.
import { Connection, MeridianError, PLAYER_KIND } from "../src/index.js";

const connection = await Connection.connect(process.argv[2] ?? "ws://127.0.0.1:7778/", { WebSocket });
const { view } = connection;
view.on("entered", (e) => console.log(`${e.name} (${e.kind === PLAYER_KIND ? "player" : `NPC ${e.kind}`}) at`, e.position));
view.on("chat", ({ sender, text }) => console.log(`${sender?.name ?? "someone"}: ${text}`));
connection.on("resuming", () => console.log("connection lost, resuming..."));
connection.on("closed", ({ reason }) => console.log("closed:", reason));

const me = await connection.login("walker");
console.log(`player ${me.playerId} at`, me.position, `on a ${me.mapWidth}x${me.mapHeight} map`);
connection.chat("hello");
for (const direction of ["up", "right", "down", "left"] as const) {
  try {
    console.log("now at", await connection.move(direction));
  } catch (error) {
    if (error instanceof MeridianError) console.log(`move ${direction} refused: ${error.codeName} ${error.detail}`);
  }
}
await connection.logout();
