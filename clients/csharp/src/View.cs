// What the player sees: itself and the entities (players and NPCs) in sight, kept from
// Entered, Moved, Left, StateChanged and ViewReset, with an event for each change. No I/O:
// the client feeds it every ServerMessage (inside Poll), and a test can too. A message that
// breaks the protocol is reported as a Violation event and applied as well as it can be.
using System;
using System.Collections.Generic;

namespace Meridian.Client
{
    /// <summary>A player or NPC in sight (or the player itself, <see cref="View.Self"/>).</summary>
    public sealed class Entity
    {
        /// <summary>Entered.kind of a player; NPC kinds are game-defined and non-zero.</summary>
        public const uint PlayerKind = 0;

        /// <summary>Players and NPCs share one id space, unique across the cluster.</summary>
        public readonly ulong Id;
        /// <summary>Its cell, as last heard.</summary>
        public Position Position { get; internal set; }
        /// <summary>Its display name.</summary>
        public string Name { get; internal set; }
        /// <summary>0 for a player, the game's (non-zero) kind for an NPC.</summary>
        public uint Kind { get; internal set; }
        /// <summary>The entity's public state: game-defined bytes (at most 1024).</summary>
        public byte[] State { get; internal set; }

        /// <summary>Kind 0: a player, not an NPC.</summary>
        public bool IsPlayer { get { return Kind == PlayerKind; } }

        internal Entity(ulong id, Position position, string name, uint kind, byte[] state)
        {
            Id = id;
            Position = position;
            Name = name;
            Kind = kind;
            State = state;
        }

        public override string ToString() { return "#" + Id + " " + Name + " at " + Position; }
    }

    /// <summary>What LoginOk told about the world and the player.</summary>
    public sealed class WorldInfo
    {
        /// <summary>The player's id, unique across the cluster.</summary>
        public ulong PlayerId;
        /// <summary>The name it logged in with.</summary>
        public string Name;
        /// <summary>Where it started.</summary>
        public Position Position;
        /// <summary>The map's size: 0 &lt;= x &lt; MapWidth, 0 &lt;= y &lt; MapHeight.</summary>
        public uint MapWidth;
        /// <summary>The map's height.</summary>
        public uint MapHeight;
        /// <summary>Sight: A sees B iff |ax - bx| &lt;= ViewRange and |ay - by| &lt;= ViewRange.</summary>
        public uint ViewRange;
    }

    /// <summary>What the player sees: kept by the client inside Poll(), read it there or after.</summary>
    public sealed class View
    {
        readonly Dictionary<ulong, Entity> entities = new Dictionary<ulong, Entity>();

        /// <summary>An entity came into sight.</summary>
        public event Action<Entity> EntityEntered;
        /// <summary>An entity (or <see cref="Self"/>) moved; the second argument is where it was.</summary>
        public event Action<Entity, Position> EntityMoved;
        /// <summary>An entity left sight (or logged out); it is no longer in <see cref="Entities"/>.</summary>
        public event Action<Entity> EntityLeft;
        /// <summary>An entity's public state changed; the second argument is the previous state.</summary>
        public event Action<Entity, byte[]> StateChanged;
        /// <summary>A GameEvent: source entity id (0 for the world), kind, payload.</summary>
        public event Action<ulong, uint, byte[]> GameEvent;
        /// <summary>Chat: speaker id, text, and the speaker if in sight (else null).</summary>
        public event Action<ulong, string, Entity> Chat;
        /// <summary>Everything seen was forgotten (a resume or restore); Entered for everything in sight follows.</summary>
        public event Action<Position> Reset;
        /// <summary>A message that breaks the protocol (also relayed as the client's Violation event).</summary>
        public event Action<ProtocolViolation> Violation;

        /// <summary>The player itself, once logged in; null before.</summary>
        public Entity Self { get; private set; }

        /// <summary>Map size and view range, once logged in.</summary>
        public WorldInfo World { get; private set; }

        /// <summary>Everything in sight but the player itself, by id.</summary>
        public IReadOnlyDictionary<ulong, Entity> Entities { get { return entities; } }

        /// <summary>The entity with this id in sight, the player itself, or null.</summary>
        public Entity Get(ulong id)
        {
            if (Self != null && Self.Id == id) return Self;
            Entity e;
            return entities.TryGetValue(id, out e) ? e : null;
        }

        /// <summary>The first entity in sight with this name, or null.</summary>
        public Entity Find(string name)
        {
            foreach (var e in entities.Values)
            {
                if (e.Name == name) return e;
            }
            return null;
        }

        /// <summary>Starts over for a player that just logged in.</summary>
        public void Start(WorldInfo world)
        {
            World = world;
            entities.Clear();
            Self = new Entity(world.PlayerId, world.Position, world.Name, Entity.PlayerKind, new byte[0]);
        }

        /// <summary>Applies one server message; those that do not concern the view are ignored.</summary>
        public void Apply(ServerMessage message)
        {
            if (message is Entered entered)
            {
                if (Self != null && entered.PlayerId == Self.Id)
                {
                    Violate("Entered for the player itself (" + entered.PlayerId + ")", message);
                    return;
                }
                if (entities.ContainsKey(entered.PlayerId))
                {
                    Violate("Entered for " + entered.PlayerId + ", already in sight", message);
                }
                var entity = new Entity(entered.PlayerId, entered.Position, entered.Name, entered.Kind, entered.State);
                entities[entity.Id] = entity;
                Raise(EntityEntered, entity);
            }
            else if (message is Moved moved)
            {
                var entity = Get(moved.PlayerId);
                if (entity == null)
                {
                    Violate("Moved for " + moved.PlayerId + ", not in sight", message);
                    return;
                }
                var previous = entity.Position;
                entity.Position = moved.Position;
                var handler = EntityMoved;
                if (handler != null) handler(entity, previous);
            }
            else if (message is Left left)
            {
                Entity entity;
                if (!entities.TryGetValue(left.PlayerId, out entity))
                {
                    Violate("Left for " + left.PlayerId + ", not in sight", message);
                    return;
                }
                entities.Remove(left.PlayerId);
                Raise(EntityLeft, entity);
            }
            else if (message is StateChanged changed)
            {
                var entity = Get(changed.EntityId);
                if (entity == null)
                {
                    Violate("StateChanged for " + changed.EntityId + ", not in sight", message);
                    return;
                }
                var previous = entity.State;
                entity.State = changed.State;
                var handler = StateChanged;
                if (handler != null) handler(entity, previous);
            }
            else if (message is GameEvent ev)
            {
                var handler = GameEvent;
                if (handler != null) handler(ev.Source, ev.Kind, ev.Payload);
            }
            else if (message is ChatMessage chat)
            {
                var handler = Chat;
                if (handler != null) handler(chat.PlayerId, chat.Text, Get(chat.PlayerId));
            }
            else if (message is ViewReset reset)
            {
                if (Self != null && reset.PlayerId != 0 && reset.PlayerId != Self.Id)
                {
                    Violate("ViewReset for player " + reset.PlayerId + ", not this player (" + Self.Id + ")", message);
                }
                entities.Clear();
                if (Self != null) Self.Position = reset.Position;
                var handler = Reset;
                if (handler != null) handler(reset.Position);
            }
        }

        void Violate(string description, ServerMessage message)
        {
            var handler = Violation;
            if (handler != null) handler(new ProtocolViolation(description, message));
        }

        static void Raise(Action<Entity> handler, Entity entity)
        {
            if (handler != null) handler(entity);
        }
    }
}
