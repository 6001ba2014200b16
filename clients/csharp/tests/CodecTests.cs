// The codec against proto/client.proto itself: the schema is parsed from the file, so a
// field added there and forgotten here fails these tests.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Text;
using System.Text.RegularExpressions;

namespace Meridian.Client.Tests
{
    /// <summary>proto/client.proto, read with a parser just big enough for it.</summary>
    public sealed class ProtoFile
    {
        public readonly Dictionary<string, List<FieldSpec>> Messages = new Dictionary<string, List<FieldSpec>>();
        public readonly Dictionary<string, Dictionary<string, int>> Enums = new Dictionary<string, Dictionary<string, int>>();

        public static string FindPath()
        {
            var env = Environment.GetEnvironmentVariable("MERIDIAN_PROTO");
            if (!string.IsNullOrEmpty(env)) return env;
            var dir = new DirectoryInfo(AppDomain.CurrentDomain.BaseDirectory);
            for (; dir != null; dir = dir.Parent)
            {
                var candidate = Path.Combine(dir.FullName, "proto", "client.proto");
                if (File.Exists(candidate)) return candidate;
            }
            throw new FileNotFoundException("proto/client.proto above " + AppDomain.CurrentDomain.BaseDirectory + " (or set MERIDIAN_PROTO)");
        }

        public static ProtoFile Load()
        {
            var text = File.ReadAllText(FindPath());
            text = Regex.Replace(text, @"//[^\n]*", "");
            var proto = new ProtoFile();
            var block = new Stack<string>();
            var token = new Regex(@"\s*(?:(message|enum|oneof)\s+(\w+)\s*\{|(\})|(\w+)\s+(\w+)\s*=\s*(\d+)\s*;|(\w+)\s*=\s*(-?\d+)\s*;|[^\n]*\n)");
            int at = 0;
            string currentMessage = null, currentEnum = null;
            var messageStack = new Stack<string>();
            while (at < text.Length)
            {
                var m = token.Match(text, at);
                if (!m.Success || m.Index != at || m.Length == 0) { at++; continue; }
                at += m.Length;
                if (m.Groups[1].Success)
                {
                    block.Push(m.Groups[1].Value);
                    if (m.Groups[1].Value == "message")
                    {
                        messageStack.Push(currentMessage);
                        currentMessage = m.Groups[2].Value;
                        proto.Messages[currentMessage] = new List<FieldSpec>();
                    }
                    else if (m.Groups[1].Value == "enum")
                    {
                        currentEnum = m.Groups[2].Value;
                        proto.Enums[currentEnum] = new Dictionary<string, int>();
                    }
                }
                else if (m.Groups[3].Success)
                {
                    var closed = block.Pop();
                    if (closed == "message") currentMessage = messageStack.Pop();
                    else if (closed == "enum") currentEnum = null;
                }
                else if (m.Groups[4].Success && currentMessage != null && currentEnum == null)
                {
                    proto.Messages[currentMessage].Add(new FieldSpec(currentMessage, m.Groups[5].Value, int.Parse(m.Groups[6].Value), m.Groups[4].Value));
                }
                else if (m.Groups[7].Success && currentEnum != null)
                {
                    proto.Enums[currentEnum][m.Groups[7].Value] = int.Parse(m.Groups[8].Value);
                }
            }
            return proto;
        }
    }

    public static class CodecTests
    {
        static readonly Dictionary<string, Type> ClientKinds = new Dictionary<string, Type>
        {
            { "Login", typeof(Login) }, { "Move", typeof(Move) }, { "Chat", typeof(Chat) }, { "Ping", typeof(Ping) },
            { "Logout", typeof(Logout) }, { "Resume", typeof(Resume) }, { "Action", typeof(ActionRequest) },
        };

        static readonly Dictionary<string, Type> ServerKinds = new Dictionary<string, Type>
        {
            { "LoginOk", typeof(LoginOk) }, { "Entered", typeof(Entered) }, { "Moved", typeof(Moved) }, { "Left", typeof(Left) },
            { "ChatMessage", typeof(ChatMessage) }, { "Pong", typeof(Pong) }, { "Error", typeof(ErrorMessage) },
            { "ViewReset", typeof(ViewReset) }, { "StateChanged", typeof(StateChanged) }, { "GameEvent", typeof(GameEvent) },
            { "ActionDone", typeof(ActionDone) },
        };

        [Test]
        public static void The_proto_parser_sees_the_file()
        {
            var proto = ProtoFile.Load();
            Assert.True(proto.Messages.ContainsKey("ClientMessage") && proto.Messages.ContainsKey("ServerMessage"), "the oneof wrappers");
            Assert.True(proto.Messages["ServerMessage"].Count >= 11, "ServerMessage kinds: " + proto.Messages["ServerMessage"].Count);
            Assert.True(proto.Messages["Login"].Any(f => f.Name == "spawn" && f.Number == 2 && f.Type == "Position"), "Login.spawn");
            Assert.True(proto.Enums["ErrorCode"]["REJECTED"] == 11, "ErrorCode.REJECTED");
        }

        [Test]
        public static void The_codec_schema_is_exactly_client_proto()
        {
            var proto = ProtoFile.Load();
            var problems = new List<string>();
            var expected = proto.Messages.SelectMany(kv => kv.Value).Select(Describe).ToList();
            var actual = Codec.Schema.Select(Describe).ToList();
            foreach (var f in expected.Except(actual)) problems.Add("in client.proto, not in the codec: " + f);
            foreach (var f in actual.Except(expected)) problems.Add("in the codec, not in client.proto: " + f);
            foreach (var name in proto.Messages.Keys)
            {
                bool known = Codec.Schema.Any(f => f.Message == name) || Codec.EmptyMessages.Contains(name);
                if (!known) problems.Add("message " + name + " is not covered");
                bool typed = name == "ClientMessage" || name == "ServerMessage" || name == "Position"
                    || ClientKinds.ContainsKey(name) || ServerKinds.ContainsKey(name);
                if (!typed) problems.Add("message " + name + " has no C# class in these tests' maps");
            }
            Assert.True(problems.Count == 0, string.Join("\n", problems));
        }

        [Test]
        public static void The_enums_are_exactly_client_proto()
        {
            var proto = ProtoFile.Load();
            CheckEnum(proto, "Direction", typeof(Direction));
            CheckEnum(proto, "ErrorCode", typeof(ErrorCode));
            Assert.Equal(2, proto.Enums.Count, "enums in client.proto (a new one needs a C# enum)");
        }

        static void CheckEnum(ProtoFile proto, string name, Type type)
        {
            var expected = proto.Enums[name].Select(kv => kv.Key + "=" + kv.Value).OrderBy(s => s);
            var actual = Enum.GetValues(type).Cast<object>().Select(v => Enum.GetName(type, v) + "=" + (int)v).OrderBy(s => s);
            Assert.Equal(string.Join(",", expected), string.Join(",", actual), name);
        }

        /// <summary>
        /// Every field of every message reaches the wire and comes back: a sample with every C#
        /// field set is encoded, the field numbers on the wire must be exactly client.proto's,
        /// and decoding it must give back every field.
        /// </summary>
        [Test]
        public static void Every_field_of_every_kind_is_written_and_read()
        {
            var proto = ProtoFile.Load();
            var problems = new List<string>();
            foreach (var kind in proto.Messages["ClientMessage"])
            {
                Type type;
                if (!ClientKinds.TryGetValue(kind.Type, out type)) { problems.Add("no C# class for " + kind.Type); continue; }
                var sample = (ClientMessage)Sample(type);
                var body = Codec.EncodeClient(sample);
                CheckWire(proto, "ClientMessage", kind, body, problems);
                var back = Codec.DecodeClient(body);
                CompareFields(sample, back, kind.Type, problems);
            }
            foreach (var kind in proto.Messages["ServerMessage"])
            {
                Type type;
                if (!ServerKinds.TryGetValue(kind.Type, out type)) { problems.Add("no C# class for " + kind.Type); continue; }
                var sample = (ServerMessage)Sample(type);
                var body = Codec.EncodeServer(sample);
                CheckWire(proto, "ServerMessage", kind, body, problems);
                var back = Codec.DecodeServer(body);
                CompareFields(sample, back, kind.Type, problems);
            }
            Assert.True(problems.Count == 0, string.Join("\n", problems));
        }

        static void CheckWire(ProtoFile proto, string wrapper, FieldSpec kind, byte[] body, List<string> problems)
        {
            var outer = WireFields(body);
            if (outer.Count != 1 || outer[0].Key != kind.Number)
            {
                problems.Add(wrapper + "." + kind.Name + ": outer fields " + string.Join(",", outer.Select(f => f.Key)));
                return;
            }
            var inner = WireFields(outer[0].Value);
            var expected = proto.Messages[kind.Type].Select(f => f.Number).OrderBy(n => n).ToList();
            var actual = inner.Select(f => f.Key).OrderBy(n => n).ToList();
            if (!expected.SequenceEqual(actual))
            {
                problems.Add(kind.Type + ": proto fields " + string.Join(",", expected) + ", on the wire " + string.Join(",", actual));
            }
            foreach (var f in proto.Messages[kind.Type].Where(f => f.Type == "Position"))
            {
                var position = inner.First(p => p.Key == f.Number).Value;
                var numbers = WireFields(position).Select(p => p.Key).OrderBy(n => n);
                var wanted = proto.Messages["Position"].Select(p => p.Number).OrderBy(n => n);
                if (!numbers.SequenceEqual(wanted)) problems.Add(kind.Type + "." + f.Name + ": Position fields on the wire " + string.Join(",", numbers));
            }
        }

        /// <summary>The top-level fields of a message: number and, for length-delimited ones, the body.</summary>
        static List<KeyValuePair<int, byte[]>> WireFields(byte[] body)
        {
            var fields = new List<KeyValuePair<int, byte[]>>();
            int at = 0;
            while (at < body.Length)
            {
                ulong tag = ReadVarint(body, ref at);
                int wire = (int)(tag & 7);
                byte[] value = null;
                if (wire == 0) ReadVarint(body, ref at);
                else if (wire == 2)
                {
                    int n = (int)ReadVarint(body, ref at);
                    value = new byte[n];
                    Array.Copy(body, at, value, 0, n);
                    at += n;
                }
                else throw new AssertionException("unexpected wire type " + wire);
                fields.Add(new KeyValuePair<int, byte[]>((int)(tag >> 3), value));
            }
            return fields;
        }

        static ulong ReadVarint(byte[] data, ref int at)
        {
            ulong value = 0;
            for (int shift = 0; ; shift += 7)
            {
                byte b = data[at++];
                value |= (ulong)(b & 0x7f) << shift;
                if ((b & 0x80) == 0) return value;
            }
        }

        /// <summary>An instance with every public field set to a distinct non-default value.</summary>
        public static object Sample(Type type)
        {
            var instance = Activator.CreateInstance(type);
            int i = 1;
            foreach (var field in type.GetFields(BindingFlags.Public | BindingFlags.Instance))
            {
                i++;
                var t = field.FieldType;
                object value;
                if (t == typeof(ulong)) value = (ulong)(1000 + i) << 33;
                else if (t == typeof(uint)) value = (uint)(300 + i);
                else if (t == typeof(string)) value = "s" + i + " é 字";
                else if (t == typeof(byte[])) value = new byte[] { (byte)i, 0, 255 };
                else if (t == typeof(Position) || t == typeof(Position?)) value = new Position((uint)i, (uint)(i + 1));
                else if (t == typeof(Direction)) value = Direction.RIGHT;
                else if (t == typeof(ErrorCode)) value = ErrorCode.REJECTED;
                else throw new AssertionException("no sample for " + type.Name + "." + field.Name + " of " + t.Name);
                field.SetValue(instance, value);
            }
            return instance;
        }

        static void CompareFields(object expected, object actual, string name, List<string> problems)
        {
            if (actual == null || actual.GetType() != expected.GetType())
            {
                problems.Add(name + ": decoded as " + (actual == null ? "null" : actual.GetType().Name));
                return;
            }
            foreach (var field in expected.GetType().GetFields(BindingFlags.Public | BindingFlags.Instance))
            {
                var a = field.GetValue(expected);
                var b = field.GetValue(actual);
                bool same = a is byte[] ? ((byte[])a).SequenceEqual((byte[])b) : Equals(a, b);
                if (!same) problems.Add(name + "." + field.Name + ": sent " + a + ", read " + b);
            }
        }

        static string Describe(FieldSpec f) { return f.Message + "." + f.Name + " = " + f.Number + " : " + f.Type; }

        [Test]
        public static void Known_bytes_decode_as_protobuf_says()
        {
            // ServerMessage{moved{player_id: 300, position{x: 1, y: 0}, client_time: 2}}, by hand.
            var body = new byte[] { 0x1a, 0x09, 0x08, 0xac, 0x02, 0x12, 0x02, 0x08, 0x01, 0x18, 0x02 };
            var moved = (Moved)Codec.DecodeServer(body);
            Assert.Equal(300UL, moved.PlayerId, "player_id");
            Assert.Equal(new Position(1, 0), moved.Position, "position");
            Assert.Equal(2UL, moved.ClientTime, "client_time");
            // ClientMessage{move{direction: UP, client_time: 1}}
            var move = Codec.EncodeClient(new Move { Direction = Direction.UP, ClientTime = 1 });
            Assert.Equal("12-04-08-01-10-01", BitConverter.ToString(move), "a Move's bytes");
            // An empty Logout is still a present kind: ClientMessage{logout{}}.
            Assert.Equal("2A-00", BitConverter.ToString(Codec.EncodeClient(new Logout())), "a Logout's bytes");
            // A Login with spawn (0, 0) keeps the spawn: present, empty.
            var login = Codec.EncodeClient(new Login { Name = "a", Spawn = new Position(0, 0) });
            Assert.Equal("0A-05-0A-01-61-12-00", BitConverter.ToString(login), "a Login at (0, 0)");
            Assert.True(((Login)Codec.DecodeClient(login)).Spawn.HasValue, "the spawn survives");
        }

        [Test]
        public static void Unknown_fields_and_kinds_are_skipped()
        {
            // Moved with an unknown varint field 9, a fixed64 field 10 and a fixed32 field 11.
            var body = new byte[] { 0x1a, 0x12, 0x08, 0x05, 0x48, 0x01, 0x51, 1, 2, 3, 4, 5, 6, 7, 8, 0x5d, 1, 2, 3, 4 };
            var moved = (Moved)Codec.DecodeServer(body);
            Assert.Equal(5UL, moved.PlayerId, "player_id beside unknown fields");
            // A kind from a newer server (field 40) is no message this SDK knows: null.
            Assert.True(Codec.DecodeServer(new byte[] { 0xc2, 0x02, 0x00 }) == null, "an unknown kind");
            Assert.True(Codec.DecodeServer(new byte[0]) == null, "no kind at all");
            // An unknown enum value is kept as its number.
            var error = (ErrorMessage)Codec.DecodeServer(new byte[] { 0x3a, 0x02, 0x08, 0x63 });
            Assert.Equal(99, (int)error.Code, "an unknown error code");
        }

        [Test]
        public static void Bad_bytes_are_a_codec_error()
        {
            // Moved.player_id as a length-delimited field: the wrong wire type.
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x1a, 0x02, 0x0a, 0x00 }), "wrong wire type");
            // The kind itself as a varint.
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x18, 0x01 }), "a kind that is not a message");
            // ChatMessage.text of invalid UTF-8.
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x2a, 0x04, 0x12, 0x02, 0xc3, 0x28 }), "invalid UTF-8");
            // A length past the end.
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x1a, 0x7f, 0x08 }), "a length past the end");
            // An eleven-byte varint; a group wire type; field number 0.
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 }), "a long varint");
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x0b }), "a group");
            Assert.Throws<CodecException>(() => Codec.DecodeServer(new byte[] { 0x00, 0x00 }), "field 0");
        }

        [Test]
        public static void Truncation_and_garbage_never_throw_anything_but_codec_errors()
        {
            var random = new Random(35);
            var samples = ServerKinds.Values.Select(t => Codec.EncodeServer((ServerMessage)Sample(t))).ToList();
            int decoded = 0, refused = 0;
            foreach (var full in samples)
            {
                for (int n = 0; n < full.Length; n++)
                {
                    var cut = new byte[n];
                    Array.Copy(full, cut, n);
                    if (TryDecode(cut)) decoded++; else refused++;
                }
            }
            for (int round = 0; round < 20000; round++)
            {
                byte[] bytes;
                if (round % 2 == 0)
                {
                    bytes = new byte[random.Next(0, 40)];
                    random.NextBytes(bytes);
                }
                else
                {
                    // A valid message with a few bytes flipped.
                    bytes = (byte[])samples[random.Next(samples.Count)].Clone();
                    for (int k = 0; k < 3; k++) bytes[random.Next(bytes.Length)] = (byte)random.Next(256);
                }
                if (TryDecode(bytes)) decoded++; else refused++;
            }
            Assert.True(decoded > 0 && refused > 0, "both outcomes happen (seed 35): " + decoded + " decoded, " + refused + " refused");
        }

        static bool TryDecode(byte[] bytes)
        {
            try
            {
                Codec.DecodeServer(bytes);
                Codec.DecodeClient(bytes);
                return true;
            }
            catch (CodecException)
            {
                return false;
            }
        }

        [Test]
        public static void Strings_are_utf8_and_a_lone_surrogate_is_refused()
        {
            var chat = (Chat)Codec.DecodeClient(Codec.EncodeClient(new Chat { Text = "héllo 世界 🐺" }));
            Assert.Equal("héllo 世界 🐺", chat.Text, "a round trip");
            Assert.Throws<EncoderFallbackException>(() => Codec.EncodeClient(new Chat { Text = "\ud800" }), "a lone surrogate");
        }
    }
}
