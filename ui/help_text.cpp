#include "ui/help_text.h"

#include <QCoreApplication>

namespace batchpilot::ui {

QString howItWorksHtml()
{
    return QCoreApplication::translate("HelpText", R"(
<h3>The target batch</h3>
<p>You choose how many samples the optimizer should see per step: the <b>target batch</b>, say
1024. Whether 1024 images fit in the device's memory at once depends on the model and the
device, so BatchPilot does not try to push them through in one go.</p>
<h3>Probing: the largest micro-batch that fits</h3>
<p>BatchPilot runs real forward and backward passes on growing <b>micro-batches</b>: 1, 2, 4, 8…
until one runs out of memory. After two successes it fits a straight line through the measured
memory peaks and jumps to the size the line predicts will just fit; then it narrows the gap
between the largest size that fit and the smallest that did not. A part of memory, the
<b>headroom</b>, is kept free. Trials that fit are not wasted: their gradients count toward the
first training batch. The <i>Probe</i> chart shows every trial: green circles fit, red squares ran
out of memory, the dashed line is the size chosen.</p>
<h3>Accumulation: reaching the target exactly</h3>
<p>With micro-batch <i>m</i> the target <i>T</i> is split into <i>k = ⌈T/m⌉</i> micro-batches of
nearly equal size. Each one's loss is weighted by its share of the batch, its gradients are added
up, and the optimizer steps once, after the last one. The result equals one big batch of
<i>T</i>, up to rounding. The <i>Training batch</i> bar fills with each micro-batch and flashes on
the optimizer step.</p>
<h3>Out of memory while training</h3>
<p>Memory can run out later too (another process, a larger input). BatchPilot then drops the
gradients of the unfinished batch, frees memory, picks a smaller micro-batch and replays the same
samples from the start, so no sample is lost or counted twice. Red lines on the memory chart and
the training-batch bar mark where it happened. After some clean steps it tries to grow again.</p>
<h3>Virtual GPUs</h3>
<p>A <b>virtual GPU</b> is the CPU with a hard memory budget: allocations past the budget fail
exactly like a GPU running out of memory. It lets you watch all of the above on any computer.
Switch the budget during a run and the trainer moves there at the next batch and probes again.</p>
)");
}

QString aboutHtml()
{
    return QCoreApplication::translate("HelpText",
                                       "<h3>BatchPilot %1</h3>"
                                       "<p>Train at the batch you want on the device you get: "
                                       "finds the largest micro-batch that fits, accumulates to "
                                       "the target batch exactly, and survives out-of-memory "
                                       "errors without losing a sample.</p>"
                                       "<p>Built with LibTorch and Qt %2.</p>")
        .arg(QCoreApplication::applicationVersion(), QString::fromLatin1(qVersion()));
}

}  // namespace batchpilot::ui
