/**
 * Matches the server's answers to the moves and actions the client sent.
 *
 * Every Move and Action gets exactly one answer carrying its `client_time` (its own
 * `Moved` ack, an `ActionDone`, or an `Error`), and a player's answers come in the order
 * its requests were sent. No I/O and no clock here: the connection feeds answers in.
 */
import { ErrorCode } from "./gen/client_pb.js";
import { MeridianError } from "./errors.js";
import type { Point } from "./messages.js";

export type RequestKind = "move" | "action";

interface Pending {
  readonly kind: RequestKind;
  readonly resolve: (value: never) => void;
  readonly reject: (error: MeridianError) => void;
}

/** What the book made of an answer. `violation` is set when the server broke the protocol. */
export interface AnswerOutcome {
  readonly matched: boolean;
  readonly violation?: string;
}

export class AnswerBook {
  #nextClientTime = 1n;
  /** Insertion order is send order. */
  #pending = new Map<bigint, Pending>();

  /** A fresh `client_time`: non-zero (proto3 does not send 0) and never reused. */
  nextClientTime(): bigint {
    return this.#nextClientTime++;
  }

  get size(): number {
    return this.#pending.size;
  }

  /** Registers a request sent with `clientTime`; the promise settles on its answer. */
  expectMove(clientTime: bigint): Promise<Point> {
    return this.#expect<Point>("move", clientTime);
  }

  expectAction(clientTime: bigint): Promise<Uint8Array> {
    return this.#expect<Uint8Array>("action", clientTime);
  }

  /** The player's own `Moved` ack. */
  onMoveAck(clientTime: bigint, position: Point): AnswerOutcome {
    return this.#answer(clientTime, "move", (pending) => pending.resolve(position as never));
  }

  onActionDone(clientTime: bigint, payload: Uint8Array): AnswerOutcome {
    return this.#answer(clientTime, "action", (pending) => pending.resolve(payload as never));
  }

  /** An `Error` carrying a `client_time`; not matched when it answers no move or action. */
  onError(error: MeridianError): AnswerOutcome {
    if (!this.#pending.has(error.clientTime)) return { matched: false };
    return this.#answer(error.clientTime, undefined, (pending) => pending.reject(error));
  }

  /** Rejects every pending request (view reset, dropped connection, logout). */
  rejectAll(detail: string): void {
    const pending = [...this.#pending];
    this.#pending.clear();
    for (const [clientTime, request] of pending) {
      request.reject(new MeridianError(ErrorCode.UNAVAILABLE, detail, clientTime, true));
    }
  }

  #expect<T>(kind: RequestKind, clientTime: bigint): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(clientTime, { kind, resolve: resolve as (value: never) => void, reject });
    });
  }

  #answer(clientTime: bigint, kind: RequestKind | undefined, settle: (pending: Pending) => void): AnswerOutcome {
    const pending = this.#pending.get(clientTime);
    if (pending === undefined) {
      return { matched: false, violation: `answer for client_time ${clientTime}, which is not pending` };
    }
    if (kind !== undefined && pending.kind !== kind) {
      return { matched: false, violation: `${kind} answer for client_time ${clientTime}, which was a ${pending.kind}` };
    }
    // Answers come in send order: requests sent before this one will never be answered.
    let skipped = 0;
    for (const [earlierTime, earlier] of this.#pending) {
      if (earlierTime === clientTime) break;
      this.#pending.delete(earlierTime);
      earlier.reject(
        new MeridianError(ErrorCode.UNAVAILABLE, "the server answered a later request first", earlierTime, true),
      );
      skipped += 1;
    }
    this.#pending.delete(clientTime);
    settle(pending);
    if (skipped > 0) {
      return { matched: true, violation: `answer for client_time ${clientTime} skipped ${skipped} earlier request(s)` };
    }
    return { matched: true };
  }
}
