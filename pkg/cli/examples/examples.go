// Package examples holds every fleet command's EXAMPLES: the one source of
// the section in its --help (pkg/cli) and in its man page (pkg/docs). The
// doc generator holds every fleet command line here to the command
// definitions, and a test runs each through the real parser, so an
// example cannot rot.
package examples

// Example is one entry: what it does, and the lines to type (or, for a
// config file, its contents).
type Example struct {
	Text string
	Cmd  string
}

// For returns the examples of command name (fleet-send, fleet-gw, ...).
func For(name string) []Example { return all()[name] }

// Names lists the commands that have examples, in no order.
func Names() []string {
	var names []string
	for n := range all() {
		names = append(names, n)
	}
	return names
}

// all builds the table on demand: a command that never prints its help
// pays nothing for it at start-up.
func all() map[string][]Example {
	return map[string][]Example{
		"fleet-gw": {
			{"Run this host's gateway with the default state folder and socket. " +
				"It logs to stderr: text on a terminal, JSON lines otherwise.",
				"fleet-gw run"},
			{"Across hosts, trust each other's signatures: collect every host's line into each host's trust file " +
				"(the default is STATE_DIR/trust; a running gateway rereads it when it changes):",
				"fleet-gw key >> /srv/fleet/trust"},
			{"Or enrol one host at a time: on build2 run fleet-gw key, then here add the line it printed; " +
				"list the trusted hosts; stop trusting build2 again (its queued messages are refused too):",
				"fleet-gw trust add 'build2 ORkw4SLmcCDR/3yAcGwAMZ3NVLfc4HMN/Iiel1DbyNo='\n" +
					"fleet-gw trust list\n" +
					"fleet-gw trust remove build2"},
			{"On the operator's machine, offline: make the operator key once, and print its trust line again " +
				"(that line goes into every host's trust file):",
				"fleet-gw operator init --out ~/fleet-operator.key --name ops\n" +
					"fleet-gw operator line --key ~/fleet-operator.key"},
			{"Certify a new host: it prints its enrolment request, the operator certifies it, the host installs " +
				"the certificate and shows it:",
				"fleet-gw cert request > build4.req                                   # on build4\n" +
					"fleet-gw operator certify --key ~/fleet-operator.key build4.req > build4.cert   # operator\n" +
					"fleet-gw cert install build4.cert                                    # on build4\n" +
					"fleet-gw cert show"},
			{"Revoke build4 everywhere: sign the next revocation list, import it on any one host " +
				"(its peers take it from there within a presence interval), and list what is revoked:",
				"fleet-gw operator revoke --key ~/fleet-operator.key --list ~/fleet-revoked.list build4 > revoked.list\n" +
					"fleet-gw cert revoked --import revoked.list\n" +
					"fleet-gw cert revoked --json"},
			{"Rotate this host's sealing key: the old one still opens what was sealed to it for 72 hours (the running " +
				"gateway announces the new one at once; hosts that trust this one by its line need the new line it prints); " +
				"list the keys; remove the retired ones past their grace (the gateway does it every minute):",
				"fleet-gw seal rotate --grace 72h\n" +
					"fleet-gw seal keys\n" +
					"fleet-gw seal destroy"},
			{"Ask the running gateway how it is (exit 0 healthy, 69 none running, 75 degraded), as JSON:",
				"fleet-gw status --json"},
			{"Make the broker login of host build2's gateway, printing the rabbitmqctl commands instead of running them:",
				"fleet-gw broker-setup --broker amqps://broker:5671/fleet --host build2 --dry-run"},
			{"Join a host with one bundle (man 7 fleet-security, JOINING A HOST): on build4, its request; on the operator's " +
				"machine, its bundle (certificate, the operator's public line, the broker login broker-setup wrote, TLS files; " +
				"0600); on build4, join, then fleet-gw run needs nothing else:",
				"fleet-gw cert request --host build4 > build4.req\n" +
					"fleet-gw operator bundle --key ~/fleet-operator.key --uri build4.uri --ca ca.pem --tls-cert build4.pem --tls-key build4.key --out build4.bundle build4.req\n" +
					"fleet-gw join build4.bundle"},
			{"Enrol host build4 in one line, from the operator's machine (it runs rabbitmqctl and reaches build4 by ssh): " +
				"the broker login, the certificate and the bundle, which only ever goes through the pipe:",
				"ssh build4 fleet-gw cert request --host build4 | fleet-gw operator enrol --key ~/fleet-operator.key --broker amqps://broker:5671/fleet --ca ca.pem --tls-cert build4.pem --tls-key build4.key | ssh build4 fleet-gw join -"},
			{"Keep the state and the socket in chosen places. Every other command then needs the same " +
				"socket, and the same state folder to use --as:",
				"fleet-gw run --state-dir /srv/fleet --socket /srv/fleet/gw.sock\n" +
					"export FLEET_SOCKET=/srv/fleet/gw.sock FLEET_STATE_DIR=/srv/fleet\n" +
					"fleet-roster"},
			{"Dead-letter an undeliverable message after three attempts at most ten seconds apart, and inject " +
				"again a message whose injection a crash cut short (it may then arrive twice):",
				"fleet-gw run --delivery-attempts 3 --retry-max 10s --uncertain reinject"},
			{"A config file holds the same settings, and any other key listed under ENVIRONMENT; flags and FLEET_* variables override it:",
				"# ~/.config/fleet/config\n" +
					"host = build1\n" +
					"delivery-attempts = 3\n" +
					"retry-max = 10s\n" +
					"uncertain = reinject"},
		},
		"fleet-send": {
			{"Send a message as the entity whose credential is in FLEET_TOKEN. " +
				"It prints the msg id and the trace id once the message is stored:",
				"fleet-send bob 'the build is green'"},
			{"Send a file as alice, whose credential fleet-roster join saved in the state folder:",
				"fleet-send --as alice bob - < report.txt"},
			{"Keep the msg id, then ask for the message's delivery state:",
				"id=$(fleet-send --as alice bob 'deploy at 17:00?' | cut -d' ' -f1)\n" +
					"fleet-send --as alice --status \"$id\""},
			{"Reply to a message received with fleet-recv; the reply goes to its sender, in the same trace:",
				"fleet-send --as bob --reply-to 3f2a9c4e-8b1d-4e6f-a7c2-5d9e0b1f4a68 'deployed, all green'"},
			{"Send the tail of a build log, and get the result as JSON:",
				"make test 2>&1 | tail -n 20 | fleet-send --as ci --json alice"},
		},
		"fleet-ask": {
			{"Ask main a question from inside a turn and wait up to two minutes for the answer:",
				"fleet-ask --as worker1 --ttl 2m main 'may I force-push to feature/x?'"},
			{"Answer it, as main, with the ask id that fleet-recv showed:",
				"fleet-send --as main --answer ASK_ID 'yes, go ahead'"},
		},
		"fleet-bcast": {
			{"Tell every entity on every host, as main:",
				"fleet-bcast --as main 'everyone: stop and report status'"},
			{"Tell only the members of group reviewers, the text from stdin:",
				"git log -1 --format=%s | fleet-bcast --as main --group reviewers -"},
			{"Add bob to group reviewers; broadcasts published from now on reach him:",
				"fleet-roster group bob --add reviewers"},
		},
		"fleet-spawn": {
			{"Start an agent called reviewer1 on host build2, with the default profile of that host's gateway, " +
				"as main. It prints the new entity's gid once the agent runs there, registered:",
				"fleet-spawn --as main --host build2 reviewer1"},
			{"The profiles are in the config file of the target host's fleet-gw: here a tmux window running claude " +
				"(messages are pasted into it), and a detached job whose messages wait for fleet-recv:",
				"# ~/.config/fleet/config on build2\n" +
					"profile.default.command = claude\n" +
					"profile.job.launcher = exec\n" +
					"profile.job.command = ./worker.sh \"$@\""},
			{"Start a job in group ci with arguments, as JSON. Sent again with the same request id, it starts " +
				"nothing new and answers with the same gid:",
				"fleet-spawn --as main --host build2 --profile job --group ci --request-id nightly-42 --json job7 -- --since yesterday"},
		},
		"fleet-stop": {
			{"Stop reviewer1 wherever it runs, as main: its tmux window closes, and what waits in its inbox is dead-lettered:",
				"fleet-stop --as main reviewer1"},
			{"Stop job7 of host build2 and get the outcome as JSON:",
				"fleet-stop --as main --json job7@build2"},
		},
		"fleet-trace": {
			{"Follow a message you sent across the fleet, as alice: every host's hops of its trace, in order " +
				"(fleet-send prints MSG_ID TRACE_ID):",
				"fleet-trace --as alice 0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68"},
			{"The same as JSON Lines, waiting up to 20 seconds for slow hosts, and only the hops of one host:",
				"fleet-trace --as alice --json --timeout 20s 0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68 | jq -c 'select(.type == \"hop\" and .host == \"build2\")'"},
		},
		"fleet-top": {
			{"Watch the fleet live on the terminal, as alice: her inbox shows, s sends or replies as her, a answers an ask put to her, r replays a dead letter, Enter shows a trace, ? the keys:",
				"fleet-top --as alice"},
			{"Print one snapshot of the hosts, the entities (with how long each has had its status), the open asks and the dead letters as tables, and exit:",
				"fleet-top --once"},
		},
		"fleet-recv": {
			{"Drain the inbox of the entity whose credential is in FLEET_TOKEN:",
				"fleet-recv"},
			{"Take only the oldest waiting message, as bob:",
				"fleet-recv --as bob -n 1"},
			{"Follow bob's inbox and print each body as it arrives:",
				"fleet-recv --as bob --follow --json | jq -r .body"},
			{"Read whole a long message a hook handed as a pointer — (a body of 51200 bytes, too long for this hook: " +
				"read it with fleet-recv --id MSGID) — with the entity's credential in FLEET_TOKEN as the hooks have it:",
				"fleet-recv --id 0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68"},
			{"The same message's body, byte for byte:",
				"fleet-recv --id 0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68 --json | jq -r .body"},
		},
		"fleet-mcp": {
			{"Give Claude Code, Codex or Gemini CLI the fleet tools as the entity main (registered with fleet-roster join main --mode pull): " +
				"the installer writes each CLI's own MCP entry (fleet-roster(1), hooks install --mcp):",
				"fleet-roster hooks install claude --mcp main\nfleet-roster hooks install codex --mcp main\nfleet-roster hooks install gemini --mcp main"},
			{"The same for one project, in the folder's .mcp.json (Claude Code), which holds no credential and can be committed:",
				"fleet-roster hooks install claude --mcp main --project ."},
			{"Codex: let send and receive run without asking (the read-only tools always do):",
				"fleet-roster hooks install codex --mcp main --approve send,receive"},
			{"What an MCP client's JSON configuration holds, by hand, with the credential in the environment instead (Gemini CLI passes " +
				"no variable named *TOKEN* unless its env names it):",
				`{"mcpServers": {"fleet": {"command": "fleet-mcp", "env": {"FLEET_TOKEN": "$FLEET_TOKEN"}}}}`},
			{"List its tools from the command line with the MCP Inspector (from the npm registry):",
				"npx @modelcontextprotocol/inspector --cli --method tools/list -- fleet-mcp --as main"},
		},
		"fleet-dlq": {
			{"List this host's dead letters, and with an operator's broker login those in bridge.dlq too:",
				"fleet-dlq list\nFLEET_DLQ_BROKER=amqps://fleet-op-ops%40fleet:PASS@broker:5671/fleet fleet-dlq list"},
			{"Only those that expired in the broker in the last hour, as JSON Lines:",
				"fleet-dlq list --reason expired --since 1h --json"},
			{"Show one whole: the message with its body, its headers and its death history:",
				"fleet-dlq show 3f2a9c4e-8b1d-4e6f-a7c2-5d9e0b1f4a68"},
			{"Deliver again, once, everything that died for bob; then remove what is left for him:",
				"fleet-dlq replay --to bob\nfleet-dlq purge --to bob"},
			{"Read bridge.dlq from a broker that wants a client certificate, with the files the host's gateway uses:",
				"export FLEET_BROKER_CA=/etc/fleet/ca.pem FLEET_BROKER_CERT=/etc/fleet/build1.pem FLEET_BROKER_KEY=/etc/fleet/build1.key\n" +
					"FLEET_DLQ_BROKER=amqps://fleet-op-ops%40fleet:PASS@broker:5671/fleet fleet-dlq list"},
			{"Only what alice sent or was sent, once the gateway has checked her credential; replay those:",
				"fleet-dlq list --as alice\nfleet-dlq replay --as alice --reason expired"},
			{"Remove the presence copies that refusals put in bridge.dlq (a replay by filter skips them):",
				"fleet-dlq purge --kind PRESENCE"},
		},
		"fleet-roster": {
			{"List this host's entities: a table on a terminal, JSON Lines otherwise:",
				"fleet-roster"},
			{"Only the entities of host build2 that are in group ops, as JSON Lines:",
				"fleet-roster list --host build2 --group ops --json"},
			{"Register a pull entity and give this shell its credential, which is shown only once:",
				"export FLEET_TOKEN=$(fleet-roster join alice --mode pull)"},
			{"Register an entity whose messages are pasted into pane 1.0 of tmux session work, as a member of group ops:",
				"fleet-roster join bob --mode inject --tmux-target work:1.0 --group ops"},
			{"Register an entity whose messages go, as JSON on stdin, to a command; exit 0 means delivered:",
				"fleet-roster join ci --mode inject --exec 'jq -r .body >> \"$HOME/ci-inbox.log\"'"},
			{"Register a pull entity that gets a desktop notification, with backoff, while messages wait:",
				"fleet-roster join carol --mode pull --nudge 'notify-send fleet \"$FLEET_PENDING message(s) for $FLEET_ENTITY\"'"},
			{"Hold inject deliveries to bob while it is busy, then let them through:",
				"fleet-roster status --as bob busy\n" +
					"fleet-roster status --as bob idle"},
			{"The caller's own row, as alice, whose credential fleet-roster join saved:",
				"fleet-roster whoami --as alice"},
			{"Put bob in group reviewers and take him out of ops; his inbox is rebound at once:",
				"fleet-roster group bob --add reviewers --remove ops"},
			{"Let only main (on any host) and the members of ops send to worker1; anyone else gets exit 77, not_accepted:",
				"fleet-roster accept worker1 add main group:ops/SEND"},
			{"See worker1's policy, then send it back to the host's accept-default:",
				"fleet-roster accept worker1 list\nfleet-roster accept worker1 reset"},
			{"Show the dead letters addressed to bob, with the reason each died:",
				"fleet-roster dead bob"},
			{"Remove bob; what waits in its inbox is dead-lettered:",
				"fleet-roster leave bob"},
			{"Make fleet-mcp an MCP server of Codex, acting as main; then see what status reads:",
				"fleet-roster hooks install codex --mcp main\nfleet-roster hooks status codex"},
			{"In the agent's tmux pane, after hooks install claude: prove the loop live, " +
				"submitting a prompt in the agent within the minute (busy, then idle, through its real hooks):",
				"fleet-roster hooks doctor claude --watch 60s"},
			{"Take fleet-mcp's entry out of Claude Code's ~/.claude.json again:",
				"fleet-roster hooks remove claude --mcp"},
			{"Options of fleet-roster itself go before the command:",
				"fleet-roster --socket /srv/fleet/gw.sock dead --json"},
		},
	}
}
