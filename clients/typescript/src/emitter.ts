/**
 * A small typed event emitter: `on` returns the function that unsubscribes.
 *
 * A listener that throws does not stop the others, nor the connection's own state machine
 * that emitted the event: its exception is rethrown on a fresh task, where the host
 * (browser console, Node's uncaught-exception handler) reports it.
 */
export type Listener<T> = (value: T) => void;

export class Emitter<Events extends object> {
  #listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Calls `listener` on every `event` until the returned function is called. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.#listeners.get(event);
    if (set === undefined) {
      set = new Set();
      this.#listeners.set(event, set);
    }
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  /** Calls `listener` on the next `event` only. */
  once<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    const off = this.on(event, (value) => {
      off();
      listener(value);
    });
    return off;
  }

  off<K extends keyof Events>(event: K, listener: Listener<Events[K]>): void {
    this.#listeners.get(event)?.delete(listener as Listener<never>);
  }

  /** How many listeners `event` has. */
  listenerCount<K extends keyof Events>(event: K): number {
    return this.#listeners.get(event)?.size ?? 0;
  }

  protected emit<K extends keyof Events>(event: K, value: Events[K]): void {
    const set = this.#listeners.get(event);
    if (set === undefined) return;
    // A copy: a listener may subscribe or unsubscribe while we iterate.
    for (const listener of [...set]) {
      try {
        (listener as Listener<Events[K]>)(value);
      } catch (error) {
        setTimeout(() => {
          throw error;
        }, 0);
      }
    }
  }
}
