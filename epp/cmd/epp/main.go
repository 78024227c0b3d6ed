// Command epp is m3fleet's endpoint picker: upstream GIE's EPP (same runner, flags, config format and
// plugins) with m3fleet's own plugins registered next to the upstream ones, the way upstream's cmd/epp invites
// ("for adding out-of-tree plugins to the plugins registry") and llm-d's inference scheduler does.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/plugins"

	"m3fleet.io/epp/contexttier"
)

func main() {
	plugins.Register(contexttier.Type, contexttier.Factory)
	if err := runner.NewRunner().WithExecutableName("m3fleet-epp").Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
