// A small hand-written protobuf codec for the client protocol, so that the library needs
// nothing outside the base class library (Unity projects break on conflicting DLLs such as
// a second Google.Protobuf). It writes canonical proto3 (default values left out) and reads
// any valid encoding: unknown fields are skipped, the last of a repeated scalar wins, and a
// known field with the wrong wire type is an error, as the server treats it.
using System;
using System.Collections.Generic;
using System.IO;
using System.Text;

namespace Meridian.Client
{
    /// <summary>Bytes that are not a valid message of the expected type.</summary>
    public sealed class CodecException : Exception
    {
        public CodecException(string message) : base(message) { }
    }

    /// <summary>Encodes and decodes the protocol's messages (bodies only; see <see cref="Framing"/> for the prefix).</summary>
    public static partial class Codec
    {
        const int Varint = 0, Fixed64 = 1, Len = 2, Fixed32 = 5;
        static readonly UTF8Encoding StrictUtf8 = new UTF8Encoding(false, true);

        // ---------------- encoding ----------------

        /// <summary>The body of a <c>ClientMessage</c> holding <paramref name="message"/>.</summary>
        public static byte[] EncodeClient(ClientMessage message)
        {
            var inner = new Writer();
            int kind;
            if (message is Login login)
            {
                kind = 1;
                inner.String(1, login.Name);
                if (login.Spawn.HasValue) inner.Message(2, EncodePosition(login.Spawn.Value), true);
                inner.String(3, login.Token);
            }
            else if (message is Move move)
            {
                kind = 2;
                inner.Varint(1, (ulong)(long)(int)move.Direction);
                inner.Varint(2, move.ClientTime);
            }
            else if (message is Chat chat)
            {
                kind = 3;
                inner.String(1, chat.Text);
            }
            else if (message is Ping ping)
            {
                kind = 4;
                inner.Varint(1, ping.ClientTime);
            }
            else if (message is Logout)
            {
                kind = 5;
            }
            else if (message is Resume resume)
            {
                kind = 6;
                inner.Bytes(1, resume.Token);
            }
            else if (message is ActionRequest action)
            {
                kind = 7;
                inner.Varint(1, action.Kind);
                inner.Bytes(2, action.Payload);
                inner.Varint(3, action.Target);
                inner.Varint(4, action.ClientTime);
            }
            else
            {
                throw new ArgumentException("not a ClientMessage kind: " + message);
            }
            var outer = new Writer();
            outer.Message(kind, inner.ToArray(), true);
            return outer.ToArray();
        }

        /// <summary>The body of a <c>ServerMessage</c>: what a server sends (for tests and test servers).</summary>
        public static byte[] EncodeServer(ServerMessage message)
        {
            var w = new Writer();
            int kind;
            if (message is LoginOk ok)
            {
                kind = 1;
                w.Varint(1, ok.PlayerId);
                w.Message(2, EncodePosition(ok.Position), false);
                w.Bytes(3, ok.ResumeToken);
                w.Varint(4, ok.MapWidth);
                w.Varint(5, ok.MapHeight);
                w.Varint(6, ok.ViewRange);
            }
            else if (message is Entered entered)
            {
                kind = 2;
                w.Varint(1, entered.PlayerId);
                w.Message(2, EncodePosition(entered.Position), false);
                w.String(3, entered.Name);
                w.Varint(4, entered.Kind);
                w.Bytes(5, entered.State);
            }
            else if (message is Moved moved)
            {
                kind = 3;
                w.Varint(1, moved.PlayerId);
                w.Message(2, EncodePosition(moved.Position), false);
                w.Varint(3, moved.ClientTime);
            }
            else if (message is Left left)
            {
                kind = 4;
                w.Varint(1, left.PlayerId);
            }
            else if (message is ChatMessage chat)
            {
                kind = 5;
                w.Varint(1, chat.PlayerId);
                w.String(2, chat.Text);
            }
            else if (message is Pong pong)
            {
                kind = 6;
                w.Varint(1, pong.ClientTime);
            }
            else if (message is ErrorMessage error)
            {
                kind = 7;
                w.Varint(1, (ulong)(long)(int)error.Code);
                w.String(2, error.Detail);
                w.Varint(3, error.ClientTime);
            }
            else if (message is ViewReset reset)
            {
                kind = 8;
                w.Varint(1, reset.PlayerId);
                w.Message(2, EncodePosition(reset.Position), false);
                w.Bytes(3, reset.ResumeToken);
            }
            else if (message is StateChanged changed)
            {
                kind = 9;
                w.Varint(1, changed.EntityId);
                w.Bytes(2, changed.State);
            }
            else if (message is GameEvent ev)
            {
                kind = 10;
                w.Varint(1, ev.Source);
                w.Varint(2, ev.Kind);
                w.Bytes(3, ev.Payload);
            }
            else if (message is ActionDone done)
            {
                kind = 11;
                w.Varint(1, done.ClientTime);
                w.Bytes(2, done.Payload);
            }
            else
            {
                throw new ArgumentException("not a ServerMessage kind: " + message);
            }
            var outer = new Writer();
            outer.Message(kind, w.ToArray(), true);
            return outer.ToArray();
        }

        static byte[] EncodePosition(Position position)
        {
            var w = new Writer();
            w.Varint(1, position.X);
            w.Varint(2, position.Y);
            return w.ToArray();
        }

        // ---------------- decoding ----------------

        /// <summary>
        /// Reads a <c>ServerMessage</c> body. Returns null for one with no kind or a kind this
        /// SDK does not know (a newer server's); throws <see cref="CodecException"/> for bytes
        /// that are not a valid message.
        /// </summary>
        public static ServerMessage DecodeServer(byte[] body)
        {
            return DecodeServer(body, 0, body.Length);
        }

        public static ServerMessage DecodeServer(byte[] body, int offset, int count)
        {
            ServerMessage result = null;
            var r = new Reader(body, offset, count);
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field >= 1 && field <= 11)
                {
                    r.Expect(wire, Len, "ServerMessage", field);
                    int start, length;
                    r.LengthDelimited(out start, out length);
                    result = DecodeServerKind(field, new Reader(body, start, length));
                }
                else
                {
                    r.Skip(wire);
                }
            }
            return result;
        }

        static ServerMessage DecodeServerKind(int kind, Reader r)
        {
            switch (kind)
            {
                case 1:
                {
                    var m = new LoginOk();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.PlayerId = r.U64(w, "LoginOk", f); break;
                            case 2: m.Position = r.Position(w, "LoginOk", f, m.Position); break;
                            case 3: m.ResumeToken = r.Bytes(w, "LoginOk", f); break;
                            case 4: m.MapWidth = r.U32(w, "LoginOk", f); break;
                            case 5: m.MapHeight = r.U32(w, "LoginOk", f); break;
                            case 6: m.ViewRange = r.U32(w, "LoginOk", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 2:
                {
                    var m = new Entered();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.PlayerId = r.U64(w, "Entered", f); break;
                            case 2: m.Position = r.Position(w, "Entered", f, m.Position); break;
                            case 3: m.Name = r.String(w, "Entered", f); break;
                            case 4: m.Kind = r.U32(w, "Entered", f); break;
                            case 5: m.State = r.Bytes(w, "Entered", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 3:
                {
                    var m = new Moved();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.PlayerId = r.U64(w, "Moved", f); break;
                            case 2: m.Position = r.Position(w, "Moved", f, m.Position); break;
                            case 3: m.ClientTime = r.U64(w, "Moved", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 4:
                {
                    var m = new Left();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        if (f == 1) m.PlayerId = r.U64(w, "Left", f);
                        else r.Skip(w);
                    }
                    return m;
                }
                case 5:
                {
                    var m = new ChatMessage();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.PlayerId = r.U64(w, "ChatMessage", f); break;
                            case 2: m.Text = r.String(w, "ChatMessage", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 6:
                {
                    var m = new Pong();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        if (f == 1) m.ClientTime = r.U64(w, "Pong", f);
                        else r.Skip(w);
                    }
                    return m;
                }
                case 7:
                {
                    var m = new ErrorMessage();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.Code = (ErrorCode)r.Enum(w, "Error", f); break;
                            case 2: m.Detail = r.String(w, "Error", f); break;
                            case 3: m.ClientTime = r.U64(w, "Error", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 8:
                {
                    var m = new ViewReset();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.PlayerId = r.U64(w, "ViewReset", f); break;
                            case 2: m.Position = r.Position(w, "ViewReset", f, m.Position); break;
                            case 3: m.ResumeToken = r.Bytes(w, "ViewReset", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 9:
                {
                    var m = new StateChanged();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.EntityId = r.U64(w, "StateChanged", f); break;
                            case 2: m.State = r.Bytes(w, "StateChanged", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                case 10:
                {
                    var m = new GameEvent();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.Source = r.U64(w, "GameEvent", f); break;
                            case 2: m.Kind = r.U32(w, "GameEvent", f); break;
                            case 3: m.Payload = r.Bytes(w, "GameEvent", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
                default:
                {
                    var m = new ActionDone();
                    while (r.More)
                    {
                        int f, w;
                        r.Tag(out f, out w);
                        switch (f)
                        {
                            case 1: m.ClientTime = r.U64(w, "ActionDone", f); break;
                            case 2: m.Payload = r.Bytes(w, "ActionDone", f); break;
                            default: r.Skip(w); break;
                        }
                    }
                    return m;
                }
            }
        }

        /// <summary>Reads a <c>ClientMessage</c> body (what a server reads: for tests and test servers). Null for no kind.</summary>
        public static ClientMessage DecodeClient(byte[] body)
        {
            ClientMessage result = null;
            var r = new Reader(body, 0, body.Length);
            while (r.More)
            {
                int field, wire;
                r.Tag(out field, out wire);
                if (field < 1 || field > 7)
                {
                    r.Skip(wire);
                    continue;
                }
                r.Expect(wire, Len, "ClientMessage", field);
                int start, length;
                r.LengthDelimited(out start, out length);
                var m = new Reader(body, start, length);
                switch (field)
                {
                    case 1:
                    {
                        var login = new Login();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) login.Name = m.String(w, "Login", f);
                            else if (f == 2) login.Spawn = m.Position(w, "Login", f, login.Spawn ?? new Position());
                            else if (f == 3) login.Token = m.String(w, "Login", f);
                            else m.Skip(w);
                        }
                        result = login;
                        break;
                    }
                    case 2:
                    {
                        var move = new Move();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) move.Direction = (Direction)m.Enum(w, "Move", f);
                            else if (f == 2) move.ClientTime = m.U64(w, "Move", f);
                            else m.Skip(w);
                        }
                        result = move;
                        break;
                    }
                    case 3:
                    {
                        var chat = new Chat();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) chat.Text = m.String(w, "Chat", f);
                            else m.Skip(w);
                        }
                        result = chat;
                        break;
                    }
                    case 4:
                    {
                        var ping = new Ping();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) ping.ClientTime = m.U64(w, "Ping", f);
                            else m.Skip(w);
                        }
                        result = ping;
                        break;
                    }
                    case 5:
                    {
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            m.Skip(w);
                        }
                        result = new Logout();
                        break;
                    }
                    case 6:
                    {
                        var resume = new Resume();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) resume.Token = m.Bytes(w, "Resume", f);
                            else m.Skip(w);
                        }
                        result = resume;
                        break;
                    }
                    default:
                    {
                        var action = new ActionRequest();
                        while (m.More)
                        {
                            int f, w;
                            m.Tag(out f, out w);
                            if (f == 1) action.Kind = m.U32(w, "Action", f);
                            else if (f == 2) action.Payload = m.Bytes(w, "Action", f);
                            else if (f == 3) action.Target = m.U64(w, "Action", f);
                            else if (f == 4) action.ClientTime = m.U64(w, "Action", f);
                            else m.Skip(w);
                        }
                        result = action;
                        break;
                    }
                }
            }
            return result;
        }
    }
}
