// What the codec covers, as data: the coverage test compares it with proto/client.proto.
namespace Meridian.Client
{
    /// <summary>One field of a proto message as this codec knows it (for the coverage test and for tools).</summary>
    public struct FieldSpec
    {
        public readonly string Message;
        public readonly string Name;
        public readonly int Number;
        public readonly string Type;

        public FieldSpec(string message, string name, int number, string type)
        {
            Message = message;
            Name = name;
            Number = number;
            Type = type;
        }
    }

    public static partial class Codec
    {
        /// <summary>Every message and field of proto/client.proto that this codec reads and writes.</summary>
        public static readonly FieldSpec[] Schema =
        {
            new FieldSpec("ClientMessage", "login", 1, "Login"),
            new FieldSpec("ClientMessage", "move", 2, "Move"),
            new FieldSpec("ClientMessage", "chat", 3, "Chat"),
            new FieldSpec("ClientMessage", "ping", 4, "Ping"),
            new FieldSpec("ClientMessage", "logout", 5, "Logout"),
            new FieldSpec("ClientMessage", "resume", 6, "Resume"),
            new FieldSpec("ClientMessage", "action", 7, "Action"),
            new FieldSpec("Login", "name", 1, "string"),
            new FieldSpec("Login", "spawn", 2, "Position"),
            new FieldSpec("Login", "token", 3, "string"),
            new FieldSpec("Move", "direction", 1, "Direction"),
            new FieldSpec("Move", "client_time", 2, "uint64"),
            new FieldSpec("Chat", "text", 1, "string"),
            new FieldSpec("Ping", "client_time", 1, "uint64"),
            new FieldSpec("Resume", "token", 1, "bytes"),
            new FieldSpec("Action", "kind", 1, "uint32"),
            new FieldSpec("Action", "payload", 2, "bytes"),
            new FieldSpec("Action", "target", 3, "uint64"),
            new FieldSpec("Action", "client_time", 4, "uint64"),
            new FieldSpec("Position", "x", 1, "uint32"),
            new FieldSpec("Position", "y", 2, "uint32"),
            new FieldSpec("ServerMessage", "login_ok", 1, "LoginOk"),
            new FieldSpec("ServerMessage", "entered", 2, "Entered"),
            new FieldSpec("ServerMessage", "moved", 3, "Moved"),
            new FieldSpec("ServerMessage", "left", 4, "Left"),
            new FieldSpec("ServerMessage", "chat", 5, "ChatMessage"),
            new FieldSpec("ServerMessage", "pong", 6, "Pong"),
            new FieldSpec("ServerMessage", "error", 7, "Error"),
            new FieldSpec("ServerMessage", "view_reset", 8, "ViewReset"),
            new FieldSpec("ServerMessage", "state_changed", 9, "StateChanged"),
            new FieldSpec("ServerMessage", "event", 10, "GameEvent"),
            new FieldSpec("ServerMessage", "action_done", 11, "ActionDone"),
            new FieldSpec("LoginOk", "player_id", 1, "uint64"),
            new FieldSpec("LoginOk", "position", 2, "Position"),
            new FieldSpec("LoginOk", "resume_token", 3, "bytes"),
            new FieldSpec("LoginOk", "map_width", 4, "uint32"),
            new FieldSpec("LoginOk", "map_height", 5, "uint32"),
            new FieldSpec("LoginOk", "view_range", 6, "uint32"),
            new FieldSpec("Entered", "player_id", 1, "uint64"),
            new FieldSpec("Entered", "position", 2, "Position"),
            new FieldSpec("Entered", "name", 3, "string"),
            new FieldSpec("Entered", "kind", 4, "uint32"),
            new FieldSpec("Entered", "state", 5, "bytes"),
            new FieldSpec("Moved", "player_id", 1, "uint64"),
            new FieldSpec("Moved", "position", 2, "Position"),
            new FieldSpec("Moved", "client_time", 3, "uint64"),
            new FieldSpec("Left", "player_id", 1, "uint64"),
            new FieldSpec("ChatMessage", "player_id", 1, "uint64"),
            new FieldSpec("ChatMessage", "text", 2, "string"),
            new FieldSpec("Pong", "client_time", 1, "uint64"),
            new FieldSpec("Error", "code", 1, "ErrorCode"),
            new FieldSpec("Error", "detail", 2, "string"),
            new FieldSpec("Error", "client_time", 3, "uint64"),
            new FieldSpec("StateChanged", "entity_id", 1, "uint64"),
            new FieldSpec("StateChanged", "state", 2, "bytes"),
            new FieldSpec("GameEvent", "source", 1, "uint64"),
            new FieldSpec("GameEvent", "kind", 2, "uint32"),
            new FieldSpec("GameEvent", "payload", 3, "bytes"),
            new FieldSpec("ActionDone", "client_time", 1, "uint64"),
            new FieldSpec("ActionDone", "payload", 2, "bytes"),
            new FieldSpec("ViewReset", "player_id", 1, "uint64"),
            new FieldSpec("ViewReset", "position", 2, "Position"),
            new FieldSpec("ViewReset", "resume_token", 3, "bytes"),
        };

        /// <summary>Messages with no fields, which the schema above cannot list by a field.</summary>
        public static readonly string[] EmptyMessages = { "Logout" };
    }
}
