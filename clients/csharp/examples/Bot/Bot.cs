// A console bot, and an operator's smoke test: logs in (dev mode), makes N moves waiting
// for each answer, and ends with the line `moves acked A of N` (exit 0 when A = N).
//
//   mono Bot.exe --addr HOST:PORT [--ws] --moves N [--name NAME] [--spawn X,Y]
using System;
using System.Linq;
using Meridian.Client;

public static class Bot
{
    static readonly TimeSpan AnswerWait = TimeSpan.FromSeconds(10);

    public static int Main(string[] args)
    {
        string addr = null, name = "bot" + new Random().Next(100000, 999999);
        bool ws = false;
        int moves = 10;
        Position? spawn = null;
        try
        {
            for (int i = 0; i < args.Length; i++)
            {
                switch (args[i])
                {
                    case "--addr": addr = args[++i]; break;
                    case "--ws": ws = true; break;
                    case "--moves": moves = int.Parse(args[++i]); break;
                    case "--name": name = args[++i]; break;
                    case "--spawn":
                        var xy = args[++i].Split(',').Select(uint.Parse).ToArray();
                        spawn = new Position(xy[0], xy[1]);
                        break;
                    default: throw new FormatException("unknown argument " + args[i]);
                }
            }
            if (addr == null || moves < 0) throw new FormatException("--addr HOST:PORT is required");
        }
        catch (Exception error) when (error is FormatException || error is IndexOutOfRangeException || error is OverflowException)
        {
            Console.Error.WriteLine("usage: mono Bot.exe --addr HOST:PORT [--ws] --moves N [--name NAME] [--spawn X,Y]: " + error.Message);
            return 2;
        }

        int acked = 0;
        var gateway = ws ? "ws://" + addr + "/" : addr;
        using (var client = new MeridianClient(gateway))
        {
            client.Resuming += reason => Console.WriteLine("connection dropped (" + reason + "); resuming");
            client.Resumed += (position, attempts, on) => Console.WriteLine("resumed on " + on + " at " + position);
            client.Error += error => Console.WriteLine("error: " + error.Message);
            try
            {
                var info = client.Wait(client.LoginAsync(name, spawn), AnswerWait);
                Console.WriteLine("logged in as " + name + " (player " + info.PlayerId + ") at " + info.Position + " via " + gateway);
                for (int i = 0; i < moves; i++)
                {
                    // Back and forth, so the bot stays where it started (a clamped move at the edge is acked too).
                    var direction = i % 2 == 0 ? Direction.RIGHT : Direction.LEFT;
                    try
                    {
                        client.Wait(client.MoveAsync(direction), AnswerWait);
                        acked++;
                    }
                    catch (MeridianException error)
                    {
                        Console.WriteLine("move " + (i + 1) + " refused: " + error.Message);
                    }
                    catch (TimeoutException)
                    {
                        Console.WriteLine("move " + (i + 1) + ": no answer within " + AnswerWait.TotalSeconds + " s");
                    }
                }
                client.Wait(client.LogoutAsync(), AnswerWait);
            }
            catch (Exception error) when (error is MeridianException || error is TimeoutException)
            {
                Console.WriteLine("error: " + error.Message);
            }
        }
        Console.WriteLine("moves acked " + acked + " of " + moves);
        return acked == moves ? 0 : 1;
    }
}
