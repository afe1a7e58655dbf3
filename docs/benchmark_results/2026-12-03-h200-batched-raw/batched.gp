set terminal pngcairo size 900,500 noenhanced
set output "batched.png"
set title "Batched decode, Llama-3.1-8B shape, one H200: 512 prompt + 128 generated per sequence"
set logscale xy 2
set xlabel "sequences decoded together"
set ylabel "aggregate decode tokens/s"
set grid
set key top left
set datafile missing "NaN"
plot "batched.dat" using 1:2 with linespoints lw 2 title "Osprey fp16", \
     "" using 1:3 with linespoints lw 2 title "Osprey MLX 4-bit g64", \
     "" using 1:4 with points pt 7 ps 1.5 title "llama.cpp fp16 (issue's figures)", \
     "" using 1:5 with points pt 5 ps 1.5 title "llama.cpp Q4_0 (issue's figures)"
