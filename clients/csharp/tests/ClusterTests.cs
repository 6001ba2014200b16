// The client against a real cluster: `meridian up --shards 2 --gateways 3 --game wolves`,
// started once for all of these tests from $MERIDIAN_BIN (or <repo>/target/debug/meridian).
// The game's own wolves are off (MERIDIAN_WOLVES_PER_SHARD=0): the tests summon the ones
// they need. Every test plays around its own spot, 60 cells from any other's (view range
// 20), so that no test's players or wolves enter another's view. The two tests that stop a
// gateway run last, each on a gateway of its own.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text;
using System.Text.RegularExpressions;
using System.Threading;

namespace Meridian.Client.Tests
{
    public sealed class TestCluster
    {
        static readonly TimeSpan StartDeadline = TimeSpan.FromSeconds(60);
        static readonly object Gate = new object();
        static TestCluster shared;
        static string startError;

        readonly Process process;
        readonly string directory;
        public readonly string LogPath;
        /// <summary>Per gateway: TCP address, WebSocket address, pid.</summary>
        public readonly List<string> Tcp = new List<string>(), Ws = new List<string>();
        public readonly List<int> GatewayPids = new List<int>();

        TestCluster(Process process, string directory, string logPath, string ready)
        {
            this.process = process;
            this.directory = directory;
            LogPath = logPath;
            // The ready file is JSON; these are the only fields read, so a regex does.
            var gateways = ready.Substring(ready.IndexOf("\"gateways\"", StringComparison.Ordinal));
            foreach (Match m in Regex.Matches(gateways, @"\{[^{}]*\}"))
            {
                var body = m.Value;
                Tcp.Add(Regex.Match(body, "\"game\"\\s*:\\s*\"([^\"]+)\"").Groups[1].Value);
                Ws.Add("ws://" + Regex.Match(body, "\"ws\"\\s*:\\s*\"([^\"]+)\"").Groups[1].Value + "/");
                GatewayPids.Add(int.Parse(Regex.Match(body, "\"pid\"\\s*:\\s*(\\d+)").Groups[1].Value));
            }
        }

        public static string MeridianBin()
        {
            var env = Environment.GetEnvironmentVariable("MERIDIAN_BIN");
            if (!string.IsNullOrEmpty(env)) return env;
            var proto = ProtoFile.FindPath();
            return Path.Combine(Path.GetDirectoryName(Path.GetDirectoryName(proto)), "target", "debug", "meridian");
        }

        /// <summary>The cluster for this run, started on first use.</summary>
        public static TestCluster Shared
        {
            get
            {
                lock (Gate)
                {
                    if (shared != null) return shared;
                    if (startError != null) throw new InvalidOperationException(startError);
                    try
                    {
                        shared = Start();
                    }
                    catch (Exception error)
                    {
                        startError = "could not start a cluster (set MERIDIAN_BIN to a built meridian): " + error.Message;
                        throw new InvalidOperationException(startError);
                    }
                    return shared;
                }
            }
        }

        static TestCluster Start()
        {
            var bin = MeridianBin();
            if (!File.Exists(bin)) throw new FileNotFoundException(bin + " does not exist");
            var dir = Path.Combine(Path.GetTempPath(), "meridian-cs-" + Process.GetCurrentProcess().Id);
            Directory.CreateDirectory(dir);
            var readyFile = Path.Combine(dir, "ready.json");
            var log = Path.Combine(dir, "up.log");
            var args = "up --shards 2 --gateways 3 --port 0 --quic-port 0 --ws-port 0 --etcd-port 0 --game wolves"
                + " --ready-file " + readyFile + " --cluster cs-test-" + Process.GetCurrentProcess().Id;
            // If this runner dies without stopping it (killed by a timeout, say), `up` gets SIGTERM
            // and stops its nodes: setpriv's parent-death signal. It fires when the starting
            // *thread* ends, so the runner starts the cluster from its main thread.
            ProcessStartInfo info;
            if (File.Exists("/usr/bin/setpriv")) info = new ProcessStartInfo("/usr/bin/setpriv", "--pdeathsig TERM " + bin + " " + args);
            else info = new ProcessStartInfo(bin, args);
            info = new ProcessStartInfo(info.FileName, info.Arguments)
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            info.EnvironmentVariables["MERIDIAN_WOLVES_PER_SHARD"] = "0";
            var process = new Process { StartInfo = info };
            var writer = TextWriter.Synchronized(new StreamWriter(log) { AutoFlush = true });
            process.OutputDataReceived += (o, e) => { if (e.Data != null) writer.WriteLine(e.Data); };
            process.ErrorDataReceived += (o, e) => { if (e.Data != null) writer.WriteLine(e.Data); };
            process.Start();
            process.BeginOutputReadLine();
            process.BeginErrorReadLine();
            var watch = Stopwatch.StartNew();
            while (watch.Elapsed < StartDeadline)
            {
                if (process.WaitForExit(100))
                {
                    throw new Exception("meridian up exited " + process.ExitCode + ": " + Tail(log));
                }
                if (File.Exists(readyFile))
                {
                    var ready = File.ReadAllText(readyFile);
                    if (ready.Contains("\"gateways\"")) return new TestCluster(process, dir, log, ready);
                }
            }
            Signal(process.Id, "TERM");
            throw new Exception("meridian up was not ready within " + StartDeadline.TotalSeconds + " s: " + Tail(log));
        }

        static string Tail(string path)
        {
            if (!File.Exists(path)) return "(no log)";
            var text = File.ReadAllText(path);
            return text.Length > 3000 ? text.Substring(text.Length - 3000) : text;
        }

        /// <summary>Sends a signal to a process this test run started (up, or one of its gateways).</summary>
        public static void Signal(int pid, string signal)
        {
            using (var kill = Process.Start(new ProcessStartInfo("kill", "-" + signal + " " + pid) { UseShellExecute = false }))
            {
                kill.WaitForExit(5000);
            }
        }

        public static void StopShared()
        {
            lock (Gate)
            {
                if (shared == null) return;
                Signal(shared.process.Id, "TERM");
                if (!shared.process.WaitForExit(20000))
                {
                    Console.WriteLine("meridian up did not stop within 20 s; killing it");
                    Signal(shared.process.Id, "KILL");
                }
                try { Directory.Delete(shared.directory, true); } catch (IOException) { }
                shared = null;
            }
        }
    }

    public static class ClusterTests
    {
        const uint Wolf = 1, Attack = 1, Summon = 2;
        static readonly TimeSpan Wait = TimeSpan.FromSeconds(10);
        static readonly string Run = (Process.GetCurrentProcess().Id % 10000).ToString();

        static MeridianClient Connect(params string[] gateways)
        {
            return new MeridianClient(new ClientOptions { Gateways = gateways.ToList(), Seed = 35 });
        }

        /// <summary>A name of its own per run: the cluster keeps accounts, and a second login of one name replaces the first.</summary>
        static string Name(string name) { return name + Run; }

        /// <summary>Polls every client until the condition holds; fails saying what was expected.</summary>
        static void Until(Func<bool> condition, string what, params MeridianClient[] clients)
        {
            var watch = Stopwatch.StartNew();
            while (!condition())
            {
                if (watch.Elapsed > Wait) throw new AssertionException("waited " + Wait.TotalSeconds + " s for " + what);
                // Each Poll waits a little for its client's input: no sleep, and no busy loop.
                foreach (var c in clients) c.Poll(clients.Length == 1 ? 20 : 5);
            }
        }

        [Test(Cluster = true)]
        public static void Two_clients_see_each_other_and_each_other_move()
        {
            var cluster = TestCluster.Shared;
            using (var alice = Connect(cluster.Tcp[0]))
            using (var bob = Connect(cluster.Tcp[0]))
            {
                var a = alice.Wait(alice.LoginAsync(Name("alice"), new Position(40, 40)), Wait);
                var b = bob.Wait(bob.LoginAsync(Name("bob"), new Position(43, 41)), Wait);
                Assert.True(a.PlayerId != b.PlayerId && a.Position == new Position(40, 40), "two players, alice at her spawn");
                Assert.True(a.World.ViewRange > 3 && a.World.MapWidth > 43 && b.ResumeToken.Length > 0, "LoginOk's world");
                Until(() => alice.View.Find(Name("bob")) != null && bob.View.Find(Name("alice")) != null, "each to see the other", alice, bob);
                var seen = alice.View.Entities[b.PlayerId];
                Assert.True(seen.Position == new Position(43, 41) && seen.IsPlayer, "bob as alice sees him: " + seen);
                var moves = new[] { Direction.RIGHT, Direction.RIGHT, Direction.DOWN }.Select(d => alice.MoveAsync(d)).ToList();
                Until(() => moves.All(m => m.IsCompleted), "alice's acks", alice, bob);
                Assert.Equal("(41, 40) (42, 40) (42, 41)", string.Join(" ", moves.Select(m => m.Result)), "acks in order");
                Assert.Equal(new Position(42, 41), alice.View.Self.Position, "alice's own view");
                Until(() => bob.View.Get(a.PlayerId) != null && bob.View.Get(a.PlayerId).Position == new Position(42, 41), "bob to see alice's last move", alice, bob);
                Assert.Equal(new Position(44, 41), bob.Wait(bob.MoveAsync(Direction.RIGHT), Wait), "bob moves");
                Until(() => alice.View.Get(b.PlayerId).Position == new Position(44, 41), "alice to see bob move", alice, bob);
            }
        }

        [Test(Cluster = true)]
        public static void A_websocket_player_and_a_tcp_player_share_the_world()
        {
            var cluster = TestCluster.Shared;
            using (var tina = Connect(cluster.Tcp[0]))
            using (var wendy = Connect(cluster.Ws[0]))
            {
                tina.Wait(tina.LoginAsync(Name("tina"), new Position(340, 40)), Wait);
                var w = wendy.Wait(wendy.LoginAsync(Name("wendy"), new Position(342, 41)), Wait);
                Until(() => tina.View.Find(Name("wendy")) != null && wendy.View.Find(Name("tina")) != null, "tina and wendy to see each other", tina, wendy);
                Assert.Equal(new Position(343, 41), wendy.Wait(wendy.MoveAsync(Direction.RIGHT), Wait), "wendy's ack over WebSocket");
                Until(() => tina.View.Get(w.PlayerId).Position == new Position(343, 41), "tina to see wendy move", tina, wendy);
            }
        }

        [Test(Cluster = true)]
        public static void See_a_wolf_attack_it_and_get_the_answer()
        {
            var cluster = TestCluster.Shared;
            using (var hunter = Connect(cluster.Tcp[0]))
            {
                var events = new List<uint>();
                hunter.View.GameEvent += (source, kind, payload) => events.Add(kind);
                hunter.Wait(hunter.LoginAsync(Name("hunter"), new Position(40, 120)), Wait);
                var summoned = hunter.Wait(hunter.ActionAsync(Summon, 0, Encoding.UTF8.GetBytes("1,0")), Wait);
                ulong wolfId = ulong.Parse(Encoding.UTF8.GetString(summoned));
                Until(() => hunter.View.Get(wolfId) != null, "the summoned wolf " + wolfId + " in view", hunter);
                var wolf = hunter.View.Get(wolfId);
                Assert.True(wolf.Kind == Wolf && !wolf.IsPlayer, "a wolf NPC: kind " + wolf.Kind);
                Assert.True(Encoding.UTF8.GetString(wolf.State).Contains("\"hp\":10"), "its public state: " + Encoding.UTF8.GetString(wolf.State));
                // The wolf may step before the attack: attack it where it is, once adjacent.
                Until(() => hunter.View.Get(wolfId) != null && Adjacent(hunter.View.Self.Position, hunter.View.Get(wolfId).Position), "the wolf next to the hunter", hunter);
                var answer = Encoding.UTF8.GetString(hunter.Wait(hunter.ActionAsync(Attack, wolfId), Wait));
                Assert.Equal("{\"hp\":6}", answer, "the attack's answer");
                Until(() => hunter.View.Get(wolfId) == null || Encoding.UTF8.GetString(hunter.View.Get(wolfId).State).Contains("\"hp\":6"), "the wolf's state to follow", hunter);
                var refused = Assert.Throws<MeridianException>(() => hunter.Wait(hunter.ActionAsync(Attack, 999999999), Wait), "an attack on nothing");
                Assert.True(refused.Code == ErrorCode.REJECTED && !refused.Local && refused.Detail.Length > 0, "REJECTED with a reason: " + refused);
                var unknown = Assert.Throws<MeridianException>(() => hunter.Wait(hunter.ActionAsync(77), Wait), "an unknown action");
                Assert.Equal(ErrorCode.REJECTED, unknown.Code, "an unknown action is REJECTED");
            }
        }

        static bool Adjacent(Position a, Position b)
        {
            return Math.Max(Math.Abs((int)a.X - (int)b.X), Math.Abs((int)a.Y - (int)b.Y)) <= 1;
        }

        [Test(Cluster = true)]
        public static void Unpaced_moves_past_the_limit_are_refused_rate_limited_and_typed()
        {
            var cluster = TestCluster.Shared;
            using (var mover = new MeridianClient(new ClientOptions { Gateways = { cluster.Tcp[0] }, PaceToLimits = false }))
            {
                mover.Wait(mover.LoginAsync(Name("hasty"), new Position(220, 1)), Wait);
                var moves = Enumerable.Range(0, 40).Select(_ => mover.MoveAsync(Direction.RIGHT)).ToList();
                Assert.True(mover.PollUntil(() => moves.All(m => m.IsCompleted), Wait), "every move answered");
                var acked = moves.Where(m => m.Status == System.Threading.Tasks.TaskStatus.RanToCompletion).Select(m => m.Result).ToList();
                var refused = moves.Where(m => m.IsFaulted).Select(m => (MeridianException)m.Exception.InnerException).ToList();
                Assert.True(acked.Count > 0 && refused.Count > 0, acked.Count + " acked, " + refused.Count + " refused");
                Assert.True(refused.All(r => r.Code == ErrorCode.RATE_LIMITED && !r.Local), "RATE_LIMITED from the server: " + refused.First());
                Assert.True(acked.Select((p, i) => p == new Position((uint)(221 + i), 1)).All(x => x), "the accepted ones applied in order");
            }
            using (var pacer = Connect(cluster.Tcp[0]))
            {
                pacer.Wait(pacer.LoginAsync(Name("pacer"), new Position(220, 30)), Wait);
                var moves = Enumerable.Range(0, 40).Select(_ => pacer.MoveAsync(Direction.RIGHT)).ToList();
                Assert.True(pacer.PollUntil(() => moves.All(m => m.IsCompleted), Wait), "every paced move answered");
                var failed = moves.Where(m => m.IsFaulted).Select(m => m.Exception.InnerException.Message).ToList();
                Assert.True(failed.Count == 0, "paced moves are never refused: " + string.Join("; ", failed.Take(3)));
                Assert.Equal(new Position(260, 30), pacer.View.Self.Position, "all 40 applied");
            }
        }

        [Test(Cluster = true)]
        public static void Chat_reaches_the_other()
        {
            var cluster = TestCluster.Shared;
            using (var alice = Connect(cluster.Tcp[0]))
            using (var bob = Connect(cluster.Tcp[1]))
            {
                var a = alice.Wait(alice.LoginAsync(Name("chatty"), new Position(160, 40)), Wait);
                bob.Wait(bob.LoginAsync(Name("listener"), new Position(161, 40)), Wait);
                Until(() => bob.View.Get(a.PlayerId) != null, "bob to see alice (across gateways)", alice, bob);
                string heard = null;
                bob.View.Chat += (from, text, sender) => heard = from + " " + text + " " + (sender == null ? "?" : sender.Name);
                alice.Chat("hello from C#");
                Until(() => heard != null, "bob to hear alice", alice, bob);
                Assert.Equal(a.PlayerId + " hello from C# " + Name("chatty"), heard, "the chat");
            }
        }

        [Test(Cluster = true)]
        public static void A_dropped_connection_resumes_by_itself()
        {
            var cluster = TestCluster.Shared;
            using (var alice = Connect(cluster.Tcp[0]))
            using (var bob = Connect(cluster.Tcp[0]))
            {
                var a = alice.Wait(alice.LoginAsync(Name("dropped"), new Position(100, 120)), Wait);
                var b = bob.Wait(bob.LoginAsync(Name("steady"), new Position(103, 120)), Wait);
                Until(() => alice.View.Get(b.PlayerId) != null, "alice to see bob", alice, bob);
                var firstToken = (byte[])a.ResumeToken.Clone();
                var events = new List<string>();
                alice.Resuming += reason => events.Add("resuming");
                alice.View.Reset += p => events.Add("reset " + p);
                alice.Sever();
                Until(() => alice.Resumes == 1, "the resume's ViewReset", alice, bob);
                Assert.Equal("resuming | reset (100, 120)", string.Join(" | ", events), "events");
                Assert.True(alice.State == ClientState.Playing && alice.View.Self.Id == a.PlayerId, "the same player, playing");
                Until(() => alice.View.Get(b.PlayerId) != null, "bob in view again", alice, bob);
                Assert.Equal(new Position(99, 120), alice.Wait(alice.MoveAsync(Direction.LEFT), Wait), "moving again");
                Until(() => bob.View.Get(a.PlayerId) != null && bob.View.Get(a.PlayerId).Position == new Position(99, 120), "bob to see alice back and moving", alice, bob);
                // A token is good once: the second drop resumes with the one the first ViewReset brought.
                Assert.True(!alice.Info.ResumeToken.SequenceEqual(firstToken), "the ViewReset's fresh token is the one held");
                alice.Sever();
                Until(() => alice.Resumes == 2, "the second resume", alice, bob);
                Assert.Equal(new Position(98, 120), alice.Wait(alice.MoveAsync(Direction.LEFT), Wait), "moving after the second resume");
            }
        }

        [Test(Cluster = true)]
        public static void The_bot_example_makes_its_moves_over_tcp_and_websocket()
        {
            var cluster = TestCluster.Shared;
            var bot = Path.Combine(AppDomain.CurrentDomain.BaseDirectory, "Bot.exe");
            foreach (var args in new[] { "--addr " + cluster.Tcp[0] + " --moves 25 --spawn 280,100", "--addr " + cluster.Ws[0].Substring(5).TrimEnd('/') + " --ws --moves 25 --spawn 280,110" })
            {
                var info = new ProcessStartInfo("mono", "'" + bot + "' " + args + " --name " + Name("bot" + args.Length)) { UseShellExecute = false, RedirectStandardOutput = true, RedirectStandardError = true };
                using (var process = Process.Start(info))
                {
                    var stderr = process.StandardError.ReadToEndAsync();
                    var output = process.StandardOutput.ReadToEnd();
                    Assert.True(process.WaitForExit(60000), "the bot ends");
                    var lines = output.Trim().Split('\n');
                    Assert.Equal("moves acked 25 of 25", lines.Last().Trim(), "the last line (" + args + "); stderr: " + stderr.Result);
                    Assert.Equal(0, process.ExitCode, "exit 0");
                }
            }
        }

        [Test(Cluster = true, Last = true)]
        public static void A_gateway_shutting_down_sends_its_players_to_another()
        {
            var cluster = TestCluster.Shared;
            using (var traveller = Connect(cluster.Tcp[2], cluster.Tcp[0]))
            using (var watcher = Connect(cluster.Tcp[0]))
            {
                var t = traveller.Wait(traveller.LoginAsync(Name("traveller"), new Position(40, 300)), Wait);
                var w = watcher.Wait(watcher.LoginAsync(Name("watcher"), new Position(42, 300)), Wait);
                Until(() => traveller.View.Get(w.PlayerId) != null && watcher.View.Get(t.PlayerId) != null, "the two to see each other", traveller, watcher);
                var errors = new List<ErrorCode>();
                traveller.Error += e => errors.Add(e.Code);
                Gateway resumedOn = null;
                traveller.Resumed += (p, n, g) => resumedOn = g;
                TestCluster.Signal(cluster.GatewayPids[2], "TERM");
                Until(() => traveller.Resumes == 1, "the resume on the other gateway", traveller, watcher);
                Assert.True(errors.Contains(ErrorCode.SHUTTING_DOWN), "SHUTTING_DOWN was heard: " + string.Join(",", errors));
                Assert.Equal(cluster.Tcp[0], resumedOn.ToString(), "resumed on the other gateway");
                Assert.Equal(t.PlayerId, traveller.View.Self.Id, "the same player");
                Assert.Equal(new Position(41, 300), traveller.Wait(traveller.MoveAsync(Direction.RIGHT), Wait), "playing on");
                Until(() => watcher.View.Get(t.PlayerId) != null && watcher.View.Get(t.PlayerId).Position == new Position(41, 300), "the watcher to see the traveller back and moving", traveller, watcher);
            }
        }

        [Test(Cluster = true, Last = true)]
        public static void A_gateway_killed_outright_and_the_client_resumes_on_another()
        {
            var cluster = TestCluster.Shared;
            using (var survivor = Connect(cluster.Ws[1], cluster.Ws[0]))
            using (var watcher = Connect(cluster.Tcp[0]))
            {
                var s = survivor.Wait(survivor.LoginAsync(Name("survivor"), new Position(100, 300)), Wait);
                var w = watcher.Wait(watcher.LoginAsync(Name("witness"), new Position(102, 300)), Wait);
                Until(() => survivor.View.Get(w.PlayerId) != null, "the survivor to see the witness", survivor, watcher);
                TestCluster.Signal(cluster.GatewayPids[1], "KILL");
                Until(() => survivor.Resumes == 1, "the resume on the other gateway", survivor, watcher);
                Assert.Equal(cluster.Ws[0], survivor.CurrentGateway.ToString(), "on the other gateway");
                Assert.Equal(new Position(101, 300), survivor.Wait(survivor.MoveAsync(Direction.RIGHT), Wait), "playing on");
                Until(() => watcher.View.Get(s.PlayerId) != null && watcher.View.Get(s.PlayerId).Position == new Position(101, 300), "the witness to see the survivor move", survivor, watcher);
            }
        }
    }
}
