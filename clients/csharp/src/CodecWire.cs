// Protobuf's wire format, the part the client protocol uses: varints, length-delimited
// fields, and skipping what is unknown.
using System;
using System.IO;

namespace Meridian.Client
{
    public static partial class Codec
    {
        // ---------------- the wire ----------------

        sealed class Writer
        {
            readonly MemoryStream buffer = new MemoryStream();

            public void Varint(int field, ulong value)
            {
                if (value == 0) return;
                RawVarint((ulong)(field << 3 | Codec.Varint));
                RawVarint(value);
            }

            public void String(int field, string value)
            {
                if (string.IsNullOrEmpty(value)) return;
                Bytes(field, StrictUtf8.GetBytes(value));
            }

            public void Bytes(int field, byte[] value)
            {
                if (value == null || value.Length == 0) return;
                Message(field, value, true);
            }

            /// <summary>A length-delimited field; an empty one is written only when <paramref name="always"/>.</summary>
            public void Message(int field, byte[] body, bool always)
            {
                if (body.Length == 0 && !always) return;
                RawVarint((ulong)(field << 3 | Len));
                RawVarint((ulong)body.Length);
                buffer.Write(body, 0, body.Length);
            }

            void RawVarint(ulong value)
            {
                while (value >= 0x80)
                {
                    buffer.WriteByte((byte)(value | 0x80));
                    value >>= 7;
                }
                buffer.WriteByte((byte)value);
            }

            public byte[] ToArray() { return buffer.ToArray(); }
        }

        sealed class Reader
        {
            readonly byte[] data;
            int position;
            readonly int end;

            public Reader(byte[] data, int offset, int count)
            {
                this.data = data;
                position = offset;
                end = offset + count;
            }

            public bool More { get { return position < end; } }

            public ulong RawVarint()
            {
                ulong value = 0;
                for (int shift = 0; shift < 70; shift += 7)
                {
                    if (position >= end) throw new CodecException("truncated varint");
                    byte b = data[position++];
                    if (shift == 63 && b > 1) throw new CodecException("varint over 64 bits");
                    value |= (ulong)(b & 0x7f) << shift;
                    if ((b & 0x80) == 0) return value;
                }
                throw new CodecException("varint longer than 10 bytes");
            }

            public void Tag(out int field, out int wire)
            {
                ulong tag = RawVarint();
                if (tag > uint.MaxValue) throw new CodecException("tag over 32 bits");
                field = (int)(tag >> 3);
                wire = (int)(tag & 7);
                if (field == 0) throw new CodecException("field number 0");
            }

            public void Expect(int wire, int expected, string message, int field)
            {
                if (wire != expected)
                {
                    throw new CodecException(message + " field " + field + ": wire type " + wire + ", expected " + expected);
                }
            }

            public void LengthDelimited(out int start, out int length)
            {
                ulong n = RawVarint();
                if (n > (ulong)(end - position)) throw new CodecException("length " + n + " past the end of the message");
                start = position;
                length = (int)n;
                position += length;
            }

            public ulong U64(int wire, string message, int field)
            {
                Expect(wire, Codec.Varint, message, field);
                return RawVarint();
            }

            /// <summary>proto3 uint32: a varint truncated to its low 32 bits.</summary>
            public uint U32(int wire, string message, int field)
            {
                Expect(wire, Codec.Varint, message, field);
                return (uint)RawVarint();
            }

            /// <summary>An enum (int32); unknown values are kept as numbers.</summary>
            public int Enum(int wire, string message, int field)
            {
                Expect(wire, Codec.Varint, message, field);
                return (int)RawVarint();
            }

            public byte[] Bytes(int wire, string message, int field)
            {
                Expect(wire, Len, message, field);
                int start, length;
                LengthDelimited(out start, out length);
                var copy = new byte[length];
                Buffer.BlockCopy(data, start, copy, 0, length);
                return copy;
            }

            public string String(int wire, string message, int field)
            {
                Expect(wire, Len, message, field);
                int start, length;
                LengthDelimited(out start, out length);
                try
                {
                    return StrictUtf8.GetString(data, start, length);
                }
                catch (ArgumentException)
                {
                    throw new CodecException(message + " field " + field + ": invalid UTF-8");
                }
            }

            /// <summary>An embedded Position, merged into <paramref name="into"/> as protobuf merges repeated messages.</summary>
            public Position Position(int wire, string message, int field, Position into)
            {
                Expect(wire, Len, message, field);
                int start, length;
                LengthDelimited(out start, out length);
                var r = new Reader(data, start, length);
                uint x = into.X, y = into.Y;
                while (r.More)
                {
                    int f, w;
                    r.Tag(out f, out w);
                    if (f == 1) x = r.U32(w, "Position", f);
                    else if (f == 2) y = r.U32(w, "Position", f);
                    else r.Skip(w);
                }
                return new Position(x, y);
            }

            public void Skip(int wire)
            {
                switch (wire)
                {
                    case Codec.Varint: RawVarint(); break;
                    case Fixed64: Advance(8); break;
                    case Len:
                    {
                        int start, length;
                        LengthDelimited(out start, out length);
                        break;
                    }
                    case Fixed32: Advance(4); break;
                    default: throw new CodecException("unsupported wire type " + wire);
                }
            }

            void Advance(int n)
            {
                if (end - position < n) throw new CodecException("truncated fixed-width field");
                position += n;
            }
        }
    }
}
