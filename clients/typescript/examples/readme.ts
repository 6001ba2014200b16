// The README's "Connect your own client" example, type-checked by `npm run lint`.
import { Connection } from "../src/index.js";   // clients/typescript

const game = await Connection.connect("ws://127.0.0.1:7778/");
game.view.on("entered", (e) => console.log(`${e.name} at (${e.position.x}, ${e.position.y})`));
game.view.on("moved", ({ entity }) => console.log(`${entity.name} -> ${entity.position.x}`));
game.view.on("chat", ({ sender, text }) => console.log(`${sender?.name}: ${text}`));
game.on("resuming", () => console.log("connection lost: resuming"));
const me = await game.login("ts-bot", { spawn: { x: 100, y: 100 } });  // dev mode: spawn
console.log("I am", me.playerId, "at", me.position);
game.chat("hello from TypeScript");
for (const step of ["right", "right", "down"] as const) {
  console.log("now at", await game.move(step));     // resolved by my own Moved ack
}
try {
  await game.action(1, { target: 0n });              // a game action (the wolves' ATTACK)
} catch (refused) {
  console.log("refused:", refused);                  // REJECTED: no target
}
await game.logout();
