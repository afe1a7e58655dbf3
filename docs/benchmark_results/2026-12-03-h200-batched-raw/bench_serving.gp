# gnuplot bench_serving.gp (run in this folder) draws bench_serving.png
set terminal pngcairo size 1400,450 noenhanced
set output "bench_serving.png"
set multiplot layout 1,3 title "osprey serve, Llama-3.1-8B shape fp16, one H200: prompt 512, generate 128"
set logscale x 2
set xlabel "concurrent clients"
set grid
set key top left
set title "throughput"
set ylabel "output tokens/s"
plot "bench_serving.dat" using 1:3 with linespoints title "output tok/s"
set title "time to first token"
set ylabel "ms"
plot "bench_serving.dat" using 1:5 with linespoints title "p50", "" using 1:6 with linespoints title "p99"
set title "inter-token latency"
set ylabel "ms"
plot "bench_serving.dat" using 1:7 with linespoints title "p50", "" using 1:8 with linespoints title "p99"
unset multiplot
