using System;

namespace Meridian.Client
{
    /// <summary>
    /// An <c>Error</c> from the server, or one the SDK makes in the same shape when it knows the
    /// answer will never come (<see cref="Local"/> is then true): a move pending when the view
    /// was reset or the connection dropped was not applied, or may not have been, and gets
    /// <c>UNAVAILABLE</c>; a message too large to send gets <c>FRAME_TOO_LARGE</c>.
    /// </summary>
    public sealed class MeridianException : Exception
    {
        /// <summary>What went wrong (docs/protocol.md section 8 says what to do about each).</summary>
        public readonly ErrorCode Code;
        /// <summary>A sentence for logs and humans, not for parsing.</summary>
        public readonly string Detail;
        /// <summary>The client_time of the Move, Action or Ping this error answers, 0 for none.</summary>
        public readonly ulong ClientTime;
        /// <summary>True when the SDK made this error rather than receiving it from the server.</summary>
        public readonly bool Local;

        /// <summary>An error as the server sent it, or as the SDK makes it (<paramref name="local"/>).</summary>
        public MeridianException(ErrorCode code, string detail, ulong clientTime = 0, bool local = false)
            : base(NameOf(code) + ": " + detail)
        {
            Code = code;
            Detail = detail;
            ClientTime = clientTime;
            Local = local;
        }

        /// <summary>The code's name as in proto/client.proto ("RATE_LIMITED").</summary>
        public string CodeName { get { return NameOf(Code); } }

        /// <summary>Whether the server always closes the connection after sending this error.</summary>
        public bool ClosesConnection
        {
            get
            {
                return Code == ErrorCode.MALFORMED || Code == ErrorCode.FRAME_TOO_LARGE
                    || Code == ErrorCode.REPLACED || Code == ErrorCode.SHUTTING_DOWN;
            }
        }

        static string NameOf(ErrorCode code)
        {
            return Enum.IsDefined(typeof(ErrorCode), code) ? code.ToString() : "UNKNOWN_" + (int)code;
        }
    }

    /// <summary>
    /// The server broke the protocol (a Moved for an entity never entered, an answer to no
    /// request, undecodable bytes...). Reported as an event, never thrown at the app: the SDK
    /// keeps going with its best reading of the state.
    /// </summary>
    public sealed class ProtocolViolation
    {
        /// <summary>What the server did wrong.</summary>
        public readonly string Description;
        /// <summary>The message that broke the protocol, when it decoded.</summary>
        public readonly ServerMessage Message;

        public ProtocolViolation(string description, ServerMessage message = null)
        {
            Description = description;
            Message = message;
        }

        public override string ToString() { return Description; }
    }
}
