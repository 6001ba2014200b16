/**
 * The WebSocket the connection needs: the browser's, Node's global one (Node >= 22), or the
 * `ws` package's, passed as `ConnectionOptions.WebSocket` on Node 20.
 */

// A function type checked bivariantly (as methods are), so that the browser's handlers
// (which take a DOM MessageEvent) and `ws`'s (which take its own event class) both fit.
type Handler<E> = { bivarianceHack(event: E): void }["bivarianceHack"];

export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  onopen: Handler<unknown> | null;
  onmessage: Handler<{ data: unknown }> | null;
  onclose: Handler<{ code: number; reason: string }> | null;
  onerror: Handler<unknown> | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** `readyState` of an open WebSocket. */
export const WEBSOCKET_OPEN = 1;

/** The global WebSocket (browsers, Node >= 22), if there is one. */
export function globalWebSocket(): WebSocketConstructor | undefined {
  return (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
}
