package coresim

import (
	"context"
	"fmt"

	"github.com/projectdavid/toolsidecar/core"
)

// RunRef names a run set up the way an application sets one up: the ids a
// drive request carries.
type RunRef struct {
	RunID, ThreadID, AssistantID, MessageID, Model string
}

// DriveBody is the JSON body of POST /v1/runs/{RunID}/drive for the run.
func (r RunRef) DriveBody() map[string]string {
	return map[string]string{"thread_id": r.ThreadID, "assistant_id": r.AssistantID, "message_id": r.MessageID, "model": r.Model}
}

// SetUpRun creates, through c, an assistant with tools, a thread, a user
// message and a run, as an application does before it drives the run.
func SetUpRun(ctx context.Context, c *core.Client, tools []core.FunctionTool) (RunRef, error) {
	a, err := c.CreateAssistant(ctx, core.AssistantCreate{Name: "a", Model: "vllm/test", Tools: tools})
	if err != nil {
		return RunRef{}, fmt.Errorf("coresim: assistant: %w", err)
	}
	th, err := c.CreateThread(ctx)
	if err != nil {
		return RunRef{}, fmt.Errorf("coresim: thread: %w", err)
	}
	msg, err := c.CreateMessage(ctx, th.ID, a.ID, "hello")
	if err != nil {
		return RunRef{}, fmt.Errorf("coresim: message: %w", err)
	}
	run, err := c.CreateRun(ctx, core.RunCreate{AssistantID: a.ID, ThreadID: th.ID})
	if err != nil {
		return RunRef{}, fmt.Errorf("coresim: run: %w", err)
	}
	return RunRef{RunID: run.ID, ThreadID: th.ID, AssistantID: a.ID, MessageID: msg.ID, Model: "vllm/test"}, nil
}
