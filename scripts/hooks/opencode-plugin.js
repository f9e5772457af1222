// fleet's OpenCode plugin (fleet-roster hooks install opencode writes it
// into OpenCode's plugin folder): busy and idle from OpenCode's own plugin
// events, by fleet-turn, as the other agent CLIs' turn hooks mark them —
//
//   chat.message (a prompt taken), session.status busy
//   or retry, tool.execute.before                      → fleet-turn busy
//   session.status idle (session.idle), every session  → fleet-turn idle
//   at start, once the TUI takes input                  → fleet-turn idle
//
// and, for a hook entity (hook delivery mode), its waiting fleet messages
// handed to the model by fleet-recv --hook opencode: appended to a tool's
// result (tool.execute.after, mid-turn), and to the prompt of a turn
// (chat.message). fleet-turn finds the entity from this process's
// ancestry in its tmux pane (fleet-roster status --pane); fleet-recv from
// FLEET_TOKEN. docs/agent-clis/opencode.md has what was measured.
// Nothing here fails a turn: a command that fails is logged (OpenCode's
// log, service "fleet") and the turn goes on.
// fleet-opencode-plugin 1
import { spawn } from "node:child_process"

export const FleetPlugin = async ({ client }) => {
  const log = (message) => {
    try {
      client?.app?.log?.({ body: { service: "fleet", level: "warn", message } })?.catch?.(() => {})
    } catch {}
  }
  // run runs argv with input on stdin, the terminal as nothing of its:
  // its stdout (the hook's answer), "" when it cannot run
  const run = (argv, input, stdin = "pipe") =>
    new Promise((resolve) => {
      let out = "",
        err = ""
      let p
      try {
        p = spawn(argv[0], argv.slice(1), { stdio: [stdin, "pipe", "pipe"] })
      } catch (e) {
        log(`${argv.join(" ")}: ${e}`)
        return resolve("")
      }
      p.stdout.on("data", (d) => (out += d))
      p.stderr.on("data", (d) => (err += d))
      p.on("error", (e) => {
        log(`${argv.join(" ")}: ${e}`)
        resolve("")
      })
      p.on("close", () => {
        if (err.trim()) log(err.trim())
        resolve(out)
      })
      if (p.stdin) {
        p.stdin.on("error", () => {})
        p.stdin.end(input ?? "")
      }
    })

  // the marks go out one after another, in order, each only when it
  // changes what was marked
  let chain = Promise.resolve(),
    marked = "",
    started = false
  const mark = (state) => {
    if (!started || state === marked) return chain
    marked = state
    chain = chain.then(() => run(["fleet-turn", state], "{}"))
    return chain
  }
  // the sessions with a turn running (a subagent's session too): idle only
  // when none is
  const busy = new Set()
  const now = () => mark(busy.size > 0 ? "busy" : "idle")

  // At start: the plugin is loaded seconds before OpenCode's TUI can
  // take input (measured: 1 to 3 s before its prompt shows; a paste then
  // is lost, and so is one right after the TUI puts the terminal in raw
  // mode). In tmux, idle once the pane shows the TUI's footer ("ctrl+p
  // commands", on its home and session screens alike: a paste the moment
  // it shows was taken 3 times of 3); outside tmux at once. Bounded: after
  // 2 minutes idle all the same.
  const ready = async () => {
    const pane = process.env.TMUX_PANE
    for (let i = 0; pane && i < 1200; i++) {
      const s = await run(["tmux", "capture-pane", "-p", "-t", pane], "")
      if (s === "" || s.includes("ctrl+p commands")) break
      await new Promise((r) => setTimeout(r, 100))
    }
    started = true
    if (!marked) now()
  }
  ready()

  const hook = async (event, sessionID) => {
    const text = await run(["fleet-recv", "--hook", "opencode", "--event", event], JSON.stringify({ session_id: sessionID ?? "" }))
    return text.trim()
  }

  return {
    event: async ({ event }) => {
      const id = event?.properties?.sessionID
      if (!id) return
      if (event.type === "session.status") {
        const t = event.properties.status?.type
        if (t === "busy" || t === "retry") busy.add(id)
        else if (t === "idle") busy.delete(id)
        else return
        now()
      } else if (event.type === "session.idle" || event.type === "session.deleted") {
        busy.delete(id)
        now()
      }
    },
    "tool.execute.before": async (input) => {
      if (input?.sessionID) busy.add(input.sessionID)
      await now()
    },
    "tool.execute.after": async (input, output) => {
      const text = await hook("tool", input?.sessionID)
      if (text && output) output.output = (typeof output.output === "string" ? output.output : "") + "\n\n" + text
    },
    "chat.message": async (input, output) => {
      // a prompt taken: busy now (the first turn after OpenCode's start
      // reached session.status busy 6 s after this, at load 10)
      if (input?.sessionID) busy.add(input.sessionID)
      await now()
      const text = await hook("prompt", input?.sessionID)
      if (!text || !output?.parts) return
      const first = output.parts.find((p) => p.type === "text")
      if (first) first.text = first.text + "\n\n" + text
    },
  }
}
