import { ErrorCode, type ServerMessage } from "./gen/client_pb.js";

/**
 * An `Error` from the server, or one the SDK makes in the same shape when it knows the
 * answer will never come (`local` is then true): a move pending when the view was reset
 * or the connection dropped was not applied, or may not have been, and gets `UNAVAILABLE`.
 */
export class MeridianError extends Error {
  override readonly name = "MeridianError";

  constructor(
    readonly code: ErrorCode,
    readonly detail: string,
    /** The `client_time` of the Move, Action or Ping this error answers, 0n for none. */
    readonly clientTime: bigint = 0n,
    /** True when the SDK made this error rather than receiving it from the server. */
    readonly local: boolean = false,
  ) {
    super(`${ErrorCode[code] ?? `error code ${code}`}: ${detail}`);
  }

  /** The code's name, as in `proto/client.proto` (`"RATE_LIMITED"`). */
  get codeName(): string {
    return ErrorCode[this.code] ?? `UNKNOWN_${this.code}`;
  }

  /** Whether the server closes the connection after sending this error. */
  get closesConnection(): boolean {
    return (
      this.code === ErrorCode.MALFORMED ||
      this.code === ErrorCode.FRAME_TOO_LARGE ||
      this.code === ErrorCode.REPLACED ||
      this.code === ErrorCode.SHUTTING_DOWN
    );
  }
}

/**
 * The server broke the protocol (a `Moved` for an entity never entered, an answer to no
 * request, a text WebSocket message...). Reported as an event, never thrown at the app: the
 * SDK keeps going with its best reading of the state.
 */
export interface ProtocolViolation {
  readonly description: string;
  /** The message that broke the protocol, when it decoded. */
  readonly message?: ServerMessage;
}
