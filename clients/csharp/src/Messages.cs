// The messages of the Meridian client protocol (proto/client.proto, package
// meridian.client.v1), as plain C# classes. The codec in Codec.cs reads and writes them;
// a test parses client.proto and checks that every message and field is covered here.
using System;

namespace Meridian.Client
{
    /// <summary>A cell of the map: 0 &lt;= X &lt; map width, 0 &lt;= Y &lt; map height.</summary>
    public struct Position : IEquatable<Position>
    {
        public readonly uint X;
        public readonly uint Y;

        public Position(uint x, uint y)
        {
            X = x;
            Y = y;
        }

        public bool Equals(Position other) { return X == other.X && Y == other.Y; }
        public override bool Equals(object obj) { return obj is Position && Equals((Position)obj); }
        public override int GetHashCode() { return (int)(X * 397 ^ Y); }
        public static bool operator ==(Position a, Position b) { return a.Equals(b); }
        public static bool operator !=(Position a, Position b) { return !a.Equals(b); }
        public override string ToString() { return "(" + X + ", " + Y + ")"; }
    }

    /// <summary>A one-cell step. UP is y-1, DOWN y+1, LEFT x-1, RIGHT x+1.</summary>
    public enum Direction
    {
        DIRECTION_UNSPECIFIED = 0,
        UP = 1,
        DOWN = 2,
        LEFT = 3,
        RIGHT = 4,
    }

    /// <summary>The code of a server <c>Error</c> (docs/protocol.md section 8 says what each means).</summary>
    public enum ErrorCode
    {
        ERROR_UNSPECIFIED = 0,
        MALFORMED = 1,
        FRAME_TOO_LARGE = 2,
        NOT_LOGGED_IN = 3,
        ALREADY_LOGGED_IN = 4,
        RATE_LIMITED = 5,
        UNAVAILABLE = 6,
        INVALID_TOKEN = 7,
        SHUTTING_DOWN = 8,
        INVALID_ARGUMENT = 9,
        REPLACED = 10,
        REJECTED = 11,
    }

    // ---- client to server: the kinds of ClientMessage's oneof ----

    /// <summary>One kind of <c>ClientMessage</c>. Encode with <see cref="Codec.EncodeClient"/>.</summary>
    public abstract class ClientMessage
    {
    }

    /// <summary>ClientMessage.login (1).</summary>
    public sealed class Login : ClientMessage
    {
        /// <summary>1..=32 bytes of UTF-8, no control or bidirectional formatting characters.</summary>
        public string Name = "";
        /// <summary>Honoured in dev mode only; null to let the server place the player.</summary>
        public Position? Spawn;
        /// <summary>A JWT from the studio's login service; empty in dev mode.</summary>
        public string Token = "";
    }

    /// <summary>ClientMessage.move (2).</summary>
    public sealed class Move : ClientMessage
    {
        public Direction Direction;
        /// <summary>Opaque to the server, echoed in the answer; non-zero.</summary>
        public ulong ClientTime;
    }

    /// <summary>ClientMessage.chat (3).</summary>
    public sealed class Chat : ClientMessage
    {
        /// <summary>1..=256 bytes of UTF-8.</summary>
        public string Text = "";
    }

    /// <summary>ClientMessage.ping (4).</summary>
    public sealed class Ping : ClientMessage
    {
        public ulong ClientTime;
    }

    /// <summary>ClientMessage.logout (5).</summary>
    public sealed class Logout : ClientMessage
    {
    }

    /// <summary>ClientMessage.resume (6).</summary>
    public sealed class Resume : ClientMessage
    {
        public byte[] Token = new byte[0];
    }

    /// <summary>ClientMessage.action (7): proto message <c>Action</c> (renamed: System.Action).</summary>
    public sealed class ActionRequest : ClientMessage
    {
        /// <summary>Game-defined, non-zero.</summary>
        public uint Kind;
        /// <summary>At most 1024 bytes.</summary>
        public byte[] Payload = new byte[0];
        /// <summary>The entity acted on, 0 for none.</summary>
        public ulong Target;
        public ulong ClientTime;
    }

    // ---- server to client: the kinds of ServerMessage's oneof ----

    /// <summary>One kind of <c>ServerMessage</c>. Decode with <see cref="Codec.DecodeServer(byte[])"/>.</summary>
    public abstract class ServerMessage
    {
    }

    /// <summary>ServerMessage.login_ok (1).</summary>
    public sealed class LoginOk : ServerMessage
    {
        public ulong PlayerId;
        public Position Position;
        public byte[] ResumeToken = new byte[0];
        public uint MapWidth;
        public uint MapHeight;
        public uint ViewRange;
    }

    /// <summary>ServerMessage.entered (2): an entity came into sight.</summary>
    public sealed class Entered : ServerMessage
    {
        public ulong PlayerId;
        public Position Position;
        public string Name = "";
        /// <summary>0 for a player, game-defined for an NPC.</summary>
        public uint Kind;
        public byte[] State = new byte[0];
    }

    /// <summary>ServerMessage.moved (3).</summary>
    public sealed class Moved : ServerMessage
    {
        public ulong PlayerId;
        public Position Position;
        /// <summary>The mover's own ack only, else 0.</summary>
        public ulong ClientTime;
    }

    /// <summary>ServerMessage.left (4).</summary>
    public sealed class Left : ServerMessage
    {
        public ulong PlayerId;
    }

    /// <summary>ServerMessage.chat (5).</summary>
    public sealed class ChatMessage : ServerMessage
    {
        public ulong PlayerId;
        public string Text = "";
    }

    /// <summary>ServerMessage.pong (6).</summary>
    public sealed class Pong : ServerMessage
    {
        public ulong ClientTime;
    }

    /// <summary>ServerMessage.error (7): proto message <c>Error</c>.</summary>
    public sealed class ErrorMessage : ServerMessage
    {
        public ErrorCode Code;
        public string Detail = "";
        /// <summary>The client_time of the Move or Action this answers; 0 otherwise.</summary>
        public ulong ClientTime;
    }

    /// <summary>ServerMessage.view_reset (8).</summary>
    public sealed class ViewReset : ServerMessage
    {
        public ulong PlayerId;
        public Position Position;
        /// <summary>A fresh resume token, or empty (keep the one held).</summary>
        public byte[] ResumeToken = new byte[0];
    }

    /// <summary>ServerMessage.state_changed (9).</summary>
    public sealed class StateChanged : ServerMessage
    {
        public ulong EntityId;
        public byte[] State = new byte[0];
    }

    /// <summary>ServerMessage.event (10): proto message <c>GameEvent</c>.</summary>
    public sealed class GameEvent : ServerMessage
    {
        /// <summary>An entity id, 0 for the world.</summary>
        public ulong Source;
        public uint Kind;
        public byte[] Payload = new byte[0];
    }

    /// <summary>ServerMessage.action_done (11).</summary>
    public sealed class ActionDone : ServerMessage
    {
        public ulong ClientTime;
        public byte[] Payload = new byte[0];
    }
}
