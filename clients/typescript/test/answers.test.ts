import { describe, expect, it } from "vitest";
import { AnswerBook, ErrorCode, MeridianError } from "../src/index.js";

/** Records how each promise settled, in the order they settled. */
function track<T>(settled: string[], label: string, promise: Promise<T>): void {
  promise.then(
    (value) => settled.push(`${label} ok ${value instanceof Uint8Array ? `[${[...value]}]` : JSON.stringify(value)}`),
    (error: MeridianError) => settled.push(`${label} ${error.codeName}${error.local ? " (local)" : ""}: ${error.detail}`),
  );
}

const flush = () => new Promise((resolve) => setTimeout(resolve, 0));

describe("AnswerBook", () => {
  it("hands out non-zero client_times that never repeat", () => {
    const book = new AnswerBook();
    const times = Array.from({ length: 1000 }, () => book.nextClientTime());
    expect(times[0]).toBe(1n);
    expect(times.includes(0n)).toBe(false);
    expect(new Set(times).size).toBe(1000);
  });

  it("resolves moves and actions by their answers, in order", async () => {
    const book = new AnswerBook();
    const settled: string[] = [];
    const [a, b, c] = [book.nextClientTime(), book.nextClientTime(), book.nextClientTime()];
    track(settled, "move a", book.expectMove(a));
    track(settled, "action b", book.expectAction(b));
    track(settled, "move c", book.expectMove(c));
    expect(book.onMoveAck(a, { x: 1, y: 2 })).toEqual({ matched: true });
    expect(book.onActionDone(b, new Uint8Array([7]))).toEqual({ matched: true });
    expect(book.onError(new MeridianError(ErrorCode.RATE_LIMITED, "slow down", c))).toEqual({ matched: true });
    await flush();
    expect(settled).toEqual(['move a ok {"x":1,"y":2}', "action b ok [7]", "move c RATE_LIMITED: slow down"]);
    expect(book.size).toBe(0);
  });

  it("rejects an action the game refused with the server's typed error", async () => {
    const book = new AnswerBook();
    const t = book.nextClientTime();
    const answer = book.expectAction(t);
    book.onError(new MeridianError(ErrorCode.REJECTED, "out of range", t));
    await expect(answer).rejects.toMatchObject({ code: ErrorCode.REJECTED, detail: "out of range", clientTime: t, local: false });
  });

  it("rejects everything pending at once (view reset)", async () => {
    const book = new AnswerBook();
    const settled: string[] = [];
    track(settled, "move 1", book.expectMove(book.nextClientTime()));
    track(settled, "action 2", book.expectAction(book.nextClientTime()));
    book.rejectAll("not applied: the view was reset");
    await flush();
    expect(settled).toEqual([
      "move 1 UNAVAILABLE (local): not applied: the view was reset",
      "action 2 UNAVAILABLE (local): not applied: the view was reset",
    ]);
    expect(book.size).toBe(0);
  });

  it("reports answers that match nothing or the wrong kind, without settling anything", async () => {
    const book = new AnswerBook();
    const settled: string[] = [];
    const t = book.nextClientTime();
    track(settled, "action", book.expectAction(t));
    expect(book.onMoveAck(t, { x: 0, y: 0 }).violation).toMatch(/move answer for client_time 1, which was a action/);
    expect(book.onActionDone(99n, new Uint8Array()).violation).toMatch(/not pending/);
    expect(book.onError(new MeridianError(ErrorCode.RATE_LIMITED, "", 99n))).toEqual({ matched: false });
    await flush();
    expect(settled).toEqual([]);
    expect(book.size).toBe(1);
  });

  it("rejects requests an answer skipped over (answers come in order), and says so", async () => {
    const book = new AnswerBook();
    const settled: string[] = [];
    const [a, b] = [book.nextClientTime(), book.nextClientTime()];
    track(settled, "move a", book.expectMove(a));
    track(settled, "move b", book.expectMove(b));
    expect(book.onMoveAck(b, { x: 3, y: 3 }).violation).toMatch(/skipped 1 earlier/);
    await flush();
    expect(settled).toEqual(["move a UNAVAILABLE (local): the server answered a later request first", 'move b ok {"x":3,"y":3}']);
  });
});
