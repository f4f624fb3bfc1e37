// Package wire is the NATS side of the worker protocol, shared by the
// sidecar's client (package bridge) and the Go worker library (package
// worker): subjects, the queue group, and how an outcome travels in a
// message. docs/worker-protocol.md describes it byte by byte.
package wire

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
)

// QueueGroup is the queue group every worker joins, so that each call
// reaches one worker of a tool.
const QueueGroup = "toolsidecar"

// ServiceName is the NATS micro service name every worker library
// registers under, so that one `nats micro stats` shows them all.
const ServiceName = "toolsidecar-worker"

// ToolMetadataKey is the key of a micro endpoint's metadata under which a
// worker declares the endpoint's tool: a tool.Declaration as JSON. The
// sidecar learns the tool's name from $SRV.INFO, which any bus client may
// answer, and takes the declaration only from a describe request on the
// tool's own subject (IsDescribe), which only a worker that NATS lets
// serve the tool receives (docs/worker-protocol.md).
const ToolMetadataKey = "toolsidecar.tool"

// CredentialsEnv names the file of a worker's credentials, which the
// embedded server issues (nats.embedded.worker_credentials): JSON with
// url, user and password. CredentialsFile is its name in the store dir.
const (
	CredentialsEnv  = "TOOLSIDECAR_WORKER_CREDENTIALS"
	CredentialsFile = "worker-credentials.json"
)

// Credentials is the content of the credentials file.
type Credentials struct {
	URL      string `json:"url"`
	User     string `json:"user"`
	Password string `json:"password"`
}

// Subject is where the named tool is served.
func Subject(prefix, name string) string { return prefix + "." + name }

// IsDescribe reports the sidecar's request for the declaration of the
// tool whose subject it came on: the worker answers with the declaration,
// and never runs the tool for it. Worker libraries before describe answer
// its empty body as a call that is not a manifest, without running it.
func IsDescribe(m *nats.Msg) bool { return m.Header.Get(tool.HeaderDescribe) != "" }

// DescribeMsg is the describe request for the tool served on subject.
func DescribeMsg(subject, reply string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Reply = reply
	m.Header.Set(tool.HeaderDescribe, "1")
	return m
}

// CancelSubject is where the cancellation of an action is published.
func CancelSubject(prefix, actionID string) string { return prefix + ".cancel." + actionID }

// CancelWildcard subscribes to every cancellation under prefix.
func CancelWildcard(prefix string) string { return prefix + ".cancel.*" }

// RepliesWildcard is every durable reply subject under prefix,
// <prefix>.replies.<instance>.<token>: the reply stream captures them, and
// workers may publish there (a reply buffered through a reconnect).
func RepliesWildcard(prefix string) string { return prefix + ".replies.>" }

// SidecarsOnly are the namespaces under prefix that only sidecars may read:
// the durable replies, and the runs' events and follow announcements
// between sidecars (<prefix>.runs.<run_id>[.follow]). Worker users are
// denied them by name: a permission to serve every tool, <prefix>.* in the
// queue group, also admits a subscription to <prefix>.> (NATS matches a
// literal ">" against "*"), which would receive them, and a deny list also
// filters what a wildcard subscription receives.
func SidecarsOnly(prefix string) []string {
	return []string{RepliesWildcard(prefix), prefix + ".runs.>"}
}

// oneLine keeps a message in one header line: a line break in a header
// value would end the header block early, and the reply would not parse.
var oneLine = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")

// ErrorMsg builds the error reply to subject: micro's two headers plus the
// taxonomy's type.
func ErrorMsg(subject string, e *tool.Error) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(tool.HeaderServiceError, oneLine.Replace(e.Message))
	m.Header.Set(tool.HeaderServiceCode, strconv.Itoa(e.Code))
	m.Header.Set(tool.HeaderErrorType, string(e.Type))
	return m
}

// IsProgress reports a progress message.
func IsProgress(m *nats.Msg) bool { return m.Header.Get(tool.HeaderProgress) != "" }

// ProgressMsg builds a progress message to subject.
func ProgressMsg(subject string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(tool.HeaderProgress, "1")
	return m
}

// IsNoResponders reports the server's answer to a request nobody serves.
func IsNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// DecodeOutcome reads a final reply: the body on success, or the error its
// headers carry. A reply with a micro code and no type is typed by code.
func DecodeOutcome(m *nats.Msg, progress int) tool.Outcome {
	codeStr := m.Header.Get(tool.HeaderServiceCode)
	if codeStr == "" && m.Header.Get(tool.HeaderErrorType) == "" {
		return tool.Outcome{Data: m.Data, Progress: progress, Sent: true}
	}
	code, _ := strconv.Atoi(codeStr)
	t := tool.ErrorType(m.Header.Get(tool.HeaderErrorType))
	if !t.Known() {
		t = tool.TypeOfCode(code)
	}
	if code == 0 {
		code = t.Code()
	}
	msg := m.Header.Get(tool.HeaderServiceError)
	if msg == "" {
		msg = string(m.Data)
	}
	return tool.Outcome{Progress: progress, Sent: true, Err: &tool.Error{Type: t, Code: code, Message: msg}}
}
