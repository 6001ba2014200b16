/**
 * What the player sees: itself and the entities (players and NPCs) in sight, kept from
 * `Entered`, `Moved`, `Left`, `StateChanged` and `ViewReset`, with events for each change.
 *
 * No I/O: `Connection` feeds it every `ServerMessage`, and a test can too. A message that
 * breaks the protocol (a `Moved` for an entity never entered, say) is reported as a
 * `violation` event and applied as well as it can be; nothing is thrown at the app.
 */
import { Emitter } from "./emitter.js";
import type { ProtocolViolation } from "./errors.js";
import type { ServerMessage } from "./gen/client_pb.js";
import { toPoint, type Point } from "./messages.js";

/** `Entered.kind` of a player; NPC kinds are game-defined and non-zero. */
export const PLAYER_KIND = 0;

export interface Entity {
  /** Players and NPCs share one id space, unique across the cluster. */
  readonly id: bigint;
  position: Point;
  name: string;
  /** 0 for a player, the game's (non-zero) kind for an NPC. */
  kind: number;
  /** The entity's public state, game-defined bytes (at most 1024). */
  state: Uint8Array;
}

export interface ViewEvents {
  entered: Entity;
  /** `entity` is `view.self` when the player itself moved. */
  moved: { entity: Entity; previous: Point };
  left: Entity;
  /** `entity` is `view.self` when the player's own state changed. */
  stateChanged: { entity: Entity; previous: Uint8Array };
  /** A `GameEvent`: `source` is an entity id, 0n for the world. */
  event: { source: bigint; kind: number; payload: Uint8Array };
  /** `sender` is undefined when the speaker is not in sight. */
  chat: { from: bigint; text: string; sender: Entity | undefined };
  /** Everything seen was forgotten; `Entered` for everything in sight follows. */
  reset: { position: Point };
  violation: ProtocolViolation;
}

/** What `LoginOk` told about the world and the player. */
export interface WorldInfo {
  readonly playerId: bigint;
  readonly name: string;
  readonly position: Point;
  readonly mapWidth: number;
  readonly mapHeight: number;
  readonly viewRange: number;
}

export class View extends Emitter<ViewEvents> {
  #self: Entity | undefined;
  #entities = new Map<bigint, Entity>();
  #world: WorldInfo | undefined;

  /** The player itself, once logged in. */
  get self(): Entity | undefined {
    return this.#self;
  }

  /** Map size and view range, once logged in. */
  get world(): WorldInfo | undefined {
    return this.#world;
  }

  /** Everything in sight but the player itself, by id. */
  get entities(): ReadonlyMap<bigint, Entity> {
    return this.#entities;
  }

  get(id: bigint): Entity | undefined {
    return id === this.#self?.id ? this.#self : this.#entities.get(id);
  }

  /** Starts over for a player that just logged in. */
  start(world: WorldInfo): void {
    this.#world = world;
    this.#entities.clear();
    this.#self = { id: world.playerId, position: world.position, name: world.name, kind: PLAYER_KIND, state: new Uint8Array() };
  }

  /** Applies one server message; those that do not concern the view are ignored. */
  apply(message: ServerMessage): void {
    const kind = message.kind;
    switch (kind.case) {
      case "entered": {
        const entered = kind.value;
        if (entered.playerId === this.#self?.id) {
          return this.#violation(`Entered for the player itself (${entered.playerId})`, message);
        }
        if (this.#entities.has(entered.playerId)) {
          this.#violation(`Entered for ${entered.playerId}, already in sight`, message);
        }
        const entity: Entity = {
          id: entered.playerId,
          position: toPoint(entered.position),
          name: entered.name,
          kind: entered.kind,
          state: entered.state,
        };
        this.#entities.set(entity.id, entity);
        return this.emit("entered", entity);
      }
      case "moved": {
        const entity = this.get(kind.value.playerId);
        if (entity === undefined) {
          return this.#violation(`Moved for ${kind.value.playerId}, not in sight`, message);
        }
        const previous = entity.position;
        entity.position = toPoint(kind.value.position);
        return this.emit("moved", { entity, previous });
      }
      case "left": {
        const entity = this.#entities.get(kind.value.playerId);
        if (entity === undefined) {
          return this.#violation(`Left for ${kind.value.playerId}, not in sight`, message);
        }
        this.#entities.delete(entity.id);
        return this.emit("left", entity);
      }
      case "stateChanged": {
        const entity = this.get(kind.value.entityId);
        if (entity === undefined) {
          return this.#violation(`StateChanged for ${kind.value.entityId}, not in sight`, message);
        }
        const previous = entity.state;
        entity.state = kind.value.state;
        return this.emit("stateChanged", { entity, previous });
      }
      case "event":
        return this.emit("event", { source: kind.value.source, kind: kind.value.kind, payload: kind.value.payload });
      case "chat":
        return this.emit("chat", { from: kind.value.playerId, text: kind.value.text, sender: this.get(kind.value.playerId) });
      case "viewReset": {
        if (this.#self !== undefined && kind.value.playerId !== 0n && kind.value.playerId !== this.#self.id) {
          this.#violation(`ViewReset for player ${kind.value.playerId}, not this player (${this.#self.id})`, message);
        }
        const position = toPoint(kind.value.position);
        this.#entities.clear();
        if (this.#self !== undefined) this.#self.position = position;
        return this.emit("reset", { position });
      }
      default:
        return;
    }
  }

  #violation(description: string, message: ServerMessage): void {
    this.emit("violation", { description, message });
  }
}
